"""The configuration schema: one frozen dataclass per section, and :class:`Config`.

The dataclasses *are* the schema. YAML files, dicts and overrides only load
into them (see :mod:`gflowdist.config.loading`); every value is checked when a
section is constructed, so ``LayoutConfig(buffers=-1)`` fails the same way as
``buffers: -1`` in a file. Each field carries ``metadata["check"]`` (a
:class:`~gflowdist.config.checks.Check`) and ``metadata["doc"]`` (one sentence
for the reference table in ``docs/configuration.md``).

A full file (every section optional, every key optional)::

    run:     {name: hypergrid, seed: 3, steps: 1000}
    launch:  {engine: mpi, nprocs: 8}
    layout:  {trainers: rest, actors: 2, buffers: 2, coordinator: true, agent_groups: 1}
    roles:   {trainer: my_roles.py:GridTrainer}
    replay:  {capacity: 50000, sampler: prioritized, replay_fraction: 0.25}
    sync:    {mode: gradients}
    learner: {epochs: 4, minibatches: 4, batch_size: 1024, max_grad_norm: 0.5}
    faults:  {heartbeat_s: 0.5, peer_timeout_s: 5}
    params:  {ndim: 2, height: 8, lr: 1e-3}
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gflowdist.config.checks import MappingCheck, found, suggest
from gflowdist.config.classes import load_class
from gflowdist.config.frozen import FrozenMapping, freeze, thaw
from gflowdist.config.loading import (
    known_keys,
    parse_override,
    read_yaml_file,
    section_from_mapping,
    set_in_tree,
)
from gflowdist.config.sections import (
    ACTOR_LOSS_REFUSED,
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
from gflowdist.engines import engine_named
from gflowdist.errors import ConfigError

__all__ = ["Config", "known_roles"]  # the sections themselves: gflowdist.config.sections

_PARAMS_CHECK = MappingCheck()
_TOP_LEVEL = [*SECTIONS, "params"]


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _frozen_params(value: Any) -> Mapping[str, Any]:
    try:
        checked = _PARAMS_CHECK(value)
    except ConfigError as err:
        raise ConfigError(err.detail, key="params") from None
    return freeze(checked)


@dataclass(frozen=True)
class Config:
    """A whole run configuration: the sections plus free-form ``params``.

    ``file`` is the file it was read from (``None`` for dicts); it is not part of
    the configuration (not compared, not in :meth:`to_dict`) but resolves
    relative ``roles`` paths and is named in error messages.
    """

    run: RunConfig = field(default_factory=RunConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    roles: RolesConfig = field(default_factory=RolesConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    params: Mapping[str, Any] = field(default_factory=FrozenMapping)
    file: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, cls in SECTIONS.items():
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise ConfigError(f"expected a {cls.__name__}, found {found(value)}", key=name, file=self.file)
        if self.sync.weights_to_coordinator_every and not self.layout.coordinator:
            raise ConfigError(
                f"is {self.sync.weights_to_coordinator_every} but layout.coordinator is false: "
                "there is no coordinator to send the weights to",
                key="sync.weights_to_coordinator_every",
                file=self.file,
            )
        policy = self.faults.on_actor_loss
        why = None if self.launch.engine == "auto" else engine_named(self.launch.engine).refuses_actor_loss(policy)
        if why:
            raise ConfigError(
                ACTOR_LOSS_REFUSED.format(policy=policy, engine=f"launch.engine is {self.launch.engine}", why=why),
                key="faults.on_actor_loss",
                file=self.file,
            )
        if policy == "replace" and self.layout.inference:
            raise ConfigError(
                f"is replace, but layout.inference is {self.layout.inference}: a replacement actor reaches only its "
                "trainer, its buffer and the collector (its inference rank is not connected to it); use "
                "on_actor_loss: continue with inference ranks",
                key="faults.on_actor_loss",
                file=self.file,
            )
        if policy == "replace" and self.run.record:
            raise ConfigError(
                "is replace, but run.record is true (--record): a replacement actor is a process the recording "
                "did not start, so gflowdist replay could not make its choices again; record with on_actor_loss: "
                "continue or fail, or run without --record",
                key="faults.on_actor_loss",
                file=self.file,
            )
        object.__setattr__(self, "params", _frozen_params(self.params))
        envs, split = self.params.get("envs_per_actor"), self.inference.split
        if self.layout.inference and isinstance(envs, int) and _is_count(envs) and envs % split:
            raise ConfigError(
                f"is {split}, which does not divide params.envs_per_actor ({envs}): an actor served by an "
                "inference rank steps its environments in inference.split equal groups",
                key="inference.split",
                file=self.file,
            )

    # --- loading ---------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, file: str | os.PathLike[str] | None = None) -> Config:
        """Build from a mapping ``{section: {key: value}}``; missing sections take defaults.

        Raises :class:`ConfigError` naming the key path (``layout.buffers``) and ``file``.
        """
        name = os.fspath(file) if file is not None else None
        try:
            if data is None:
                data = {}
            if not isinstance(data, Mapping):
                raise ConfigError(f"expected a mapping of sections, found {found(data)}")
            for key in data:
                if not isinstance(key, str) or key not in _TOP_LEVEL:
                    hint = suggest(key, _TOP_LEVEL) if isinstance(key, str) else ""
                    raise ConfigError(
                        f"unknown section '{key}'{hint}; valid sections are: {', '.join(_TOP_LEVEL)}", key=str(key)
                    )
            sections = {
                section: section_from_mapping(section_cls, data.get(section), section)
                for section, section_cls in SECTIONS.items()
            }
            return cls(**sections, params=_frozen_params(data.get("params")), file=name)
        except ConfigError as err:
            if err.file is not None or name is None:
                raise
            raise ConfigError(err.detail, key=err.key, file=name) from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str], overrides: Iterable[str] = ()) -> Config:
        """Read a YAML file, then apply ``overrides`` (see :meth:`apply_overrides`).

        An empty file (nothing, or only comments, or ``{}``) is refused: a run
        needs at least its role classes, and all defaults is never what was meant.
        """
        data = read_yaml_file(path)
        if data is None or data == {}:
            raise ConfigError(
                "the file is empty: a config needs at least the role classes (roles.trainer: "
                "my_roles.py:MyTrainer); see docs/configuration.md",
                file=os.fspath(path),
            )
        config = cls.from_dict(data, file=path)
        return config.apply_overrides(overrides)

    def apply_overrides(self, overrides: Iterable[str]) -> Config:
        """A new config with ``["layout.buffers=2", "params.lr=0.01"]`` applied in order.

        Values are parsed as YAML (numbers, bools, ``null``, ``[a, b]`` lists).
        ``params.a.b=1`` creates nested mappings. An error names the override.
        """
        overrides = list(overrides)
        if not overrides:
            return self
        tree = self.to_dict()
        by_key: dict[str, str] = {}
        for text in overrides:
            path, value = parse_override(text)
            self._check_override_path(path, text)
            set_in_tree(tree, path, value)
            by_key[".".join(path)] = text
        try:
            return Config.from_dict(tree, file=self.file)
        except ConfigError as err:
            culprit = by_key.get(err.key or "")
            if culprit is not None:
                raise ConfigError(f"{err.detail} (from override '{culprit}')", key=err.key) from None
            listed = ", ".join(f"'{text}'" for text in overrides)
            raise ConfigError(f"{err.detail} (after overrides {listed})", key=err.key, file=err.file) from None

    @staticmethod
    def _check_override_path(path: list[str], text: str) -> None:
        head = path[0]
        if head not in _TOP_LEVEL:
            homes = [name for name, cls in SECTIONS.items() if head in known_keys(cls)]
            hint = (
                f" (did you mean '{homes[0]}.{text}'?)"
                if len(homes) == 1 and len(path) == 1
                else suggest(head, _TOP_LEVEL)
            )
            raise ConfigError(f"unknown section '{head}'{hint} in override '{text}'", key=".".join(path))
        if head == "params":
            if len(path) < 2:
                raise ConfigError(
                    f"override '{text}' must name a key inside params (params.<name>=value)", key="params"
                )
            return
        valid = [f.name for f in dataclasses.fields(SECTIONS[head])]
        removed: dict[str, str] = getattr(SECTIONS[head], "removed", {})
        if len(path) == 2 and path[1] in removed:
            raise ConfigError(f"{removed[path[1]]} (override '{text}')", key=".".join(path))
        if len(path) == 3 and head == "replay" and path[1] in ("sampler", "writer"):
            return  # an option of the sampler or writer: checked by the registry (replay.sampler.alpha=0.5)
        if len(path) != 2 or path[1] not in valid:
            leaf = path[1] if len(path) > 1 else ""
            hint = suggest(leaf, valid) if leaf else ""
            raise ConfigError(
                f"unknown key '{'.'.join(path[1:])}'{hint} in override '{text}'; valid keys are: {', '.join(valid)}",
                key=".".join(path),
            )

    # --- output ----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dicts/lists; ``Config.from_dict(c.to_dict()) == c``."""
        out: dict[str, Any] = {name: getattr(self, name).to_dict() for name in SECTIONS}
        out["params"] = thaw(self.params)
        return out

    def role_class(self, role: str, *, base: type | None = None) -> type | None:
        """Import the class configured for ``role`` (``roles.<role>``); ``None`` if unset."""
        if role not in known_roles():
            raise ConfigError(
                f"unknown role '{role}'{suggest(role, known_roles())}", key=f"roles.{role}", file=self.file
            )
        ref = getattr(self.roles, role)
        if ref is None:
            return None
        return load_class(ref, key=f"roles.{role}", file=self.file, base=base)


def known_roles() -> list[str]:
    """The role names of the ``roles`` section."""
    return [f.name for f in dataclasses.fields(RolesConfig)]
