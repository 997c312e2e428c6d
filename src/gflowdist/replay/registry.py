"""Samplers and writers by name, each with its own options: what ``replay.sampler`` / ``replay.writer`` name.

A config names a part by a string or by a mapping with ``name`` and that
part's options::

    replay:
      sampler: {name: prioritized, alpha: 0.6, beta: 0.4}
      writer: {name: dedup, key: terminal}

Every registered part declares its options (default, check, one line of
documentation); the config is checked against them when it is loaded, so an
unknown name or option, or a bad value, is a ``ConfigError`` naming the key
(``replay.sampler.alpha``) before anything runs. Register your own with
:func:`register_sampler` / :func:`register_writer` (in the module that defines
the class, imported before the config is loaded), or name its class directly:
``sampler: {name: my_samplers.py:FreshestFirst, ...}`` passes the options to
its constructor unchecked.

Built in: samplers ``uniform``, ``prioritized`` (``alpha``, ``beta``, ``eps``,
``beta_final``, ``beta_steps``), ``fifo`` and ``queue`` (on-policy: each item
once, back-pressure on producers; see docs/replay.md); writers
``round_robin``, ``keep_highest`` and ``dedup`` (``key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gflowdist.errors import ConfigError

__all__ = [
    "Option",
    "Part",
    "SAMPLERS",
    "WRITERS",
    "register_sampler",
    "register_writer",
    "part_spec",
    "build_part",
]


@dataclass(frozen=True)
class Option:
    """One option of a part: its default, its check (a :class:`gflowdist.config.checks.Check`), a line of docs."""

    default: Any
    check: Any
    doc: str = ""


@dataclass(frozen=True)
class Part:
    """A registered sampler or writer: how to build it from its options."""

    name: str
    factory: Callable[..., Any]
    options: Mapping[str, Option] = field(default_factory=dict)
    doc: str = ""


SAMPLERS: dict[str, Part] = {}
WRITERS: dict[str, Part] = {}


def register_sampler(
    name: str, factory: Callable[..., Any], options: Mapping[str, Option] | None = None, doc: str = ""
) -> None:
    """Make ``replay.sampler: {name: <name>, ...options}`` build ``factory(**options)``."""
    SAMPLERS[name] = Part(name, factory, dict(options or {}), doc)


def register_writer(
    name: str, factory: Callable[..., Any], options: Mapping[str, Option] | None = None, doc: str = ""
) -> None:
    """Make ``replay.writer: {name: <name>, ...options}`` build ``factory(**options)``."""
    WRITERS[name] = Part(name, factory, dict(options or {}), doc)


def _registry(kind: str) -> dict[str, Part]:
    _register_builtins()
    return SAMPLERS if kind == "sampler" else WRITERS


def part_spec(kind: str, value: Any, key: str) -> dict[str, Any]:
    """``value`` (a name, or a mapping with ``name`` and options) checked and completed with the defaults.

    ``kind`` is ``"sampler"`` or ``"writer"``; ``key`` the config key named by an error.
    """
    from gflowdist.config.checks import found, suggest

    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"expected a {kind} name or a mapping {{name: ..., <options>}}, found {found(value)}", key=key
        )
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a {kind} mapping needs its name (e.g. {{name: uniform}}), found {dict(value)!r}", key=key)
    options = {k: v for k, v in value.items() if k != "name"}
    registry = _registry(kind)
    if name not in registry:
        if ":" in name:  # a class reference: its options go to its constructor as they are
            return {"name": name, **options}
        raise ConfigError(
            f"unknown {kind} '{name}'{suggest(name, list(registry))}; one of {', '.join(sorted(registry))}, "
            f"or a class reference 'module:Class'",
            key=key,
        )
    part = registry[name]
    spec: dict[str, Any] = {"name": name}
    for option in options:
        if option not in part.options:
            valid = ", ".join(part.options) or "none"
            raise ConfigError(
                f"{kind} '{name}' has no option '{option}'{suggest(option, list(part.options))}; its options: {valid}",
                key=f"{key}.{option}",
            )
    for option, spec_option in part.options.items():
        given = options.get(option, spec_option.default)
        try:
            spec[option] = spec_option.check(given)
        except ConfigError as err:
            raise ConfigError(err.detail, key=f"{key}.{option}") from None
    return spec


def build_part(kind: str, spec: Mapping[str, Any], **extra: Any) -> Any:
    """The sampler or writer ``spec`` names (``extra`` keyword arguments go to factories that take them)."""
    name = spec["name"]
    options = {k: v for k, v in spec.items() if k != "name"}
    registry = _registry(kind)
    if name in registry:
        return registry[name].factory(**options, **extra)
    from gflowdist.config.classes import load_class

    return load_class(name, key=f"replay.{kind}")(**options)


_BUILT_IN = False


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """A factory that imports ``gflowdist.replay.<module>.<name>`` when it is first called."""

    def build(*args: Any, **kwargs: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(f"gflowdist.replay.{module}"), name)(*args, **kwargs)

    build.__qualname__ = build.__name__ = name
    return build


def _register_builtins() -> None:
    """The built-in parts (registered on first use: the config checks import nothing from here at load)."""
    global _BUILT_IN
    if _BUILT_IN:
        return
    _BUILT_IN = True
    from gflowdist.config.checks import FloatCheck, IntCheck, OptionalCheck, StrCheck

    # the classes are imported when a part is built, not when a config is checked (they import torch)
    UniformSampler, PrioritizedSampler = _lazy("samplers", "UniformSampler"), _lazy("samplers", "PrioritizedSampler")
    FifoSampler, QueueSampler = _lazy("samplers", "FifoSampler"), _lazy("samplers", "QueueSampler")
    RoundRobinWriter, KeepHighestWriter = _lazy("writers", "RoundRobinWriter"), _lazy("writers", "KeepHighestWriter")
    DedupWriter = _lazy("writers", "DedupWriter")

    register_sampler("uniform", UniformSampler, doc="uniform with replacement")
    register_sampler(
        "prioritized",
        PrioritizedSampler,
        {
            "alpha": Option(0.6, FloatCheck(0.0), "P(i) proportional to priority^alpha"),
            "beta": Option(0.4, FloatCheck(0.0), "importance-weight exponent (the first, when it anneals)"),
            "eps": Option(1e-6, FloatCheck(0.0, low_open=True), "added to every priority"),
            "beta_final": Option(
                None, OptionalCheck(FloatCheck(0.0)), "beta anneals linearly to this; null = constant"
            ),
            "beta_steps": Option(0, IntCheck(low=0), "learner steps over which beta anneals"),
        },
        doc="proportional prioritized replay",
    )
    register_sampler("fifo", FifoSampler, doc="oldest first, each item once; the oldest unserved overwritten when full")
    register_sampler(
        "queue", QueueSampler, doc="on-policy queue: oldest first, each item once, producers held back when full"
    )
    register_writer("round_robin", RoundRobinWriter, doc="every item admitted; the oldest overwritten when full")
    register_writer("keep_highest", KeepHighestWriter, doc="keeps the capacity highest-scoring items")
    register_writer(
        "dedup",
        lambda key: DedupWriter(key),
        {"key": Option(None, OptionalCheck(StrCheck(nonempty=True)), "the field naming a duplicate (e.g. terminal)")},
        doc="refuses items whose key is stored",
    )
