"""Run configuration: frozen dataclasses are the schema; YAML and dicts load into them.

    from gflowdist.config import Config
    cfg = Config.from_yaml("run.yaml", overrides=["layout.buffers=2"])
    cfg.layout.buffers          # 2
    cfg.params["lr"]            # free-form, for the user's classes

Every mistake is a :class:`~gflowdist.errors.ConfigError` naming the file and
the key path (``run.yaml: layout.buffers: expected an integer >= 0 or 'rest',
found str 'two'``). See docs/configuration.md for every key.
"""

from __future__ import annotations

from gflowdist.config.classes import absolute_ref, check_class_ref, load_class
from gflowdist.config.frozen import FrozenMapping
from gflowdist.config.loading import parse_yaml, read_yaml_file
from gflowdist.config.reference import config_reference_markdown
from gflowdist.config.schema import Config
from gflowdist.config.sections import (
    REST,
    SECTIONS,
    FaultsConfig,
    InferenceConfig,
    LaunchConfig,
    LayoutConfig,
    LearnerConfig,
    ReplayConfig,
    ReportConfig,
    RolesConfig,
    RunConfig,
    SyncConfig,
)
from gflowdist.errors import ConfigError

__all__ = [
    "Config",
    "ConfigError",
    "RunConfig",
    "LaunchConfig",
    "LayoutConfig",
    "RolesConfig",
    "ReplayConfig",
    "SyncConfig",
    "LearnerConfig",
    "FaultsConfig",
    "ReportConfig",
    "InferenceConfig",
    "SECTIONS",
    "REST",
    "load_class",
    "FrozenMapping",
    "check_class_ref",
    "absolute_ref",
    "config_reference_markdown",
    "parse_yaml",
    "read_yaml_file",
]
