"""The config a launcher hands its ranks: checked and frozen once, read once by each rank.

``gflowdist run`` loads the config (file, overrides, ``--resume``'s recorded
one) and checks it before anything launches; it then writes the result, every
override applied, to ``<run dir>/.launch-config.yaml`` and names that file in
``$GFLOWDIST_LAUNCH_CONFIG``. Each rank reads that file (a few kB, already
within :mod:`gflowdist.config.limits`) instead of parsing the user's file
and overrides again, so every rank runs exactly the config the launcher
checked, even if the file changes meanwhile. The launcher removes the file
when the job ends.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from gflowdist.config.loading import read_yaml_file
from gflowdist.config.schema import Config
from gflowdist.errors import ConfigError

__all__ = ["LAUNCH_CONFIG_FILE", "write_launch_config", "read_launch_config"]

LAUNCH_CONFIG_FILE = ".launch-config.yaml"


def write_launch_config(run_dir: str | os.PathLike[str], config: Config) -> Path:
    """Write ``config`` (with the file it came from, which resolves relative role paths) for the ranks."""
    path = Path(run_dir) / LAUNCH_CONFIG_FILE
    text = yaml.safe_dump({"file": config.file and os.fspath(config.file), "config": config.to_dict()}, sort_keys=False)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def read_launch_config(path: str | os.PathLike[str]) -> Config:
    """The config :func:`write_launch_config` wrote (a :class:`ConfigError` naming ``path`` if it is unusable)."""
    data = read_yaml_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ConfigError("not a config written by gflowdist run (no 'config' mapping)", file=os.fspath(path))
    return Config.from_dict(data["config"], file=data.get("file"))
