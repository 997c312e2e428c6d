"""The replay section's parts: ``replay.sampler`` / ``replay.writer`` as a name or a mapping, and the old flat keys.

``replay.sampler: prioritized`` and ``replay.sampler: {name: prioritized, alpha: 0.6}``
are both accepted; so are the old flat keys (``priority_alpha``, ``priority_beta``,
``priority_beta_final``, ``priority_beta_steps``, ``dedup_key``), folded into the
part they belong to. A flat key for a part that is not configured, or one that
disagrees with the nested option, is refused in one line giving the new
spelling; nothing is ignored. The registry of parts and their options is
:mod:`gflowdist.replay.registry`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gflowdist.config.checks import Check
from gflowdist.config.frozen import FrozenMapping
from gflowdist.errors import ConfigError

__all__ = ["FLAT_KEYS", "PartCheck", "fold_flat_keys"]


class PartCheck(Check):
    """A sampler or writer: a name, or a mapping ``{name: ..., <options>}`` (checked in full, with the
    old flat keys folded in, by :meth:`ReplayConfig.check_together` against :mod:`gflowdist.replay.registry`)."""

    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str) and value:
            return FrozenMapping({"name": value})
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return FrozenMapping(value)
        raise self.fail(value)

    def describe(self) -> str:
        return "str \\| mapping"

    def expected(self) -> str:
        return f"a {self.kind} name or a mapping {{name: ..., <options>}}"


#: The old flat replay keys: key -> (part, the part's name they apply to, its option).
FLAT_KEYS = {
    "priority_alpha": ("sampler", "prioritized", "alpha"),
    "priority_beta": ("sampler", "prioritized", "beta"),
    "priority_beta_final": ("sampler", "prioritized", "beta_final"),
    "priority_beta_steps": ("sampler", "prioritized", "beta_steps"),
    "dedup_key": ("writer", "dedup", "key"),
}


def fold_flat_keys(cfg: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(sampler spec, writer spec, flat key values)`` of replay section ``cfg``: the flat keys folded
    into the specs, the specs checked and completed by the registry, each flat key's value as it now
    applies (None for a part that is not configured)."""
    from gflowdist.replay.registry import part_spec

    sampler, writer = dict(cfg.sampler), dict(cfg.writer)
    for flat, (part, name, option) in FLAT_KEYS.items():
        value = getattr(cfg, flat)
        if value is None:
            continue
        spec = sampler if part == "sampler" else writer
        if spec["name"] != name:
            raise ConfigError(
                f"applies to {part} '{name}' only, and replay.{part} is '{spec['name']}' "
                f"(new spelling: replay.{part}: {{name: {name}, {option}: {value}}})",
                key=f"replay.{flat}",
            )
        if option in spec and spec[option] != value:
            raise ConfigError(
                f"is {value} but replay.{part}.{option} is {spec[option]}; give it once, as "
                f"replay.{part}: {{name: {name}, {option}: ...}}",
                key=f"replay.{flat}",
            )
        spec[option] = value
    sampler = part_spec("sampler", sampler, "replay.sampler")
    writer = part_spec("writer", writer, "replay.writer")
    flat_values = {}
    for flat, (part, name, option) in FLAT_KEYS.items():
        spec = sampler if part == "sampler" else writer
        flat_values[flat] = spec[option] if spec["name"] == name else None
    return sampler, writer, flat_values
