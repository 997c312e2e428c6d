"""The layout's counts: how many trainers, actors, buffers and inference ranks a world size gets.

Step 1 of :mod:`gflowdist.layout.planning`: ``W = T + A + B + I + C``, at most
one of ``T``, ``A``, ``B`` given as ``"rest"`` (``W - I - C - (the other
two)``); a count that cannot work (no trainer, actors without a buffer, a
buffer without a client, agent groups that do not divide the trainers) is
refused with the sum spelled out. :func:`fitting_world_sizes` and
:func:`describe_fit` say which ``-n`` a layout fits. Pure arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gflowdist.config.loading import section_from_mapping
from gflowdist.config.sections import REST, LayoutConfig
from gflowdist.errors import ConfigError, LayoutError

__all__ = [
    "LayoutCounts",
    "as_layout_config",
    "counted",
    "describe_fit",
    "fitting_world_sizes",
    "resolve_counts",
    "split_evenly",
]

_ROLE_NAMES = ("trainers", "actors", "buffers")


def split_evenly(total: int, parts: int) -> list[int]:
    """``parts`` near-equal sizes summing to ``total``; the first ``total % parts`` are one larger."""
    base, extra = divmod(total, parts)
    return [base + 1 if index < extra else base for index in range(parts)]


def counted(number: int, noun: str) -> str:
    """``"1 trainer"``, ``"3 trainers"``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


@dataclass(frozen=True)
class LayoutCounts:
    """Resolved role counts: ``trainers + actors + buffers + (1 if coordinator) == world_size``."""

    trainers: int
    actors: int
    buffers: int
    coordinator: bool
    inference: int = 0

    @property
    def clients(self) -> int:
        """Ranks a buffer may serve: ``trainers + actors``."""
        return self.trainers + self.actors


def as_layout_config(layout_cfg: LayoutConfig | Mapping[str, Any]) -> LayoutConfig:
    """``layout_cfg`` as a :class:`LayoutConfig` (a mapping is checked as the ``layout`` section)."""
    if isinstance(layout_cfg, LayoutConfig):
        return layout_cfg
    if isinstance(layout_cfg, Mapping):
        try:
            return section_from_mapping(LayoutConfig, layout_cfg, "layout")
        except ConfigError as err:
            raise LayoutError(f"invalid layout: {err}") from None
    raise LayoutError(f"expected a LayoutConfig or a mapping, found {type(layout_cfg).__name__}")


def resolve_counts(world_size: int, layout_cfg: LayoutConfig) -> LayoutCounts:
    """Turn the configured counts (numbers or one ``"rest"``) into numbers for ``world_size``.

    Raises :class:`LayoutError` explaining the sum when the counts do not add up.
    """
    configured = layout_cfg.counts()
    rest = [name for name in _ROLE_NAMES if configured[name] == REST]
    if len(rest) > 1:
        raise LayoutError(f"at most one count may be 'rest', but {' and '.join(rest)} both are")
    for name in _ROLE_NAMES:
        value = configured[name]
        if value != REST and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise LayoutError(f"the number of {name} must be an integer >= 0 or 'rest', found {value!r}")
    coordinators = 1 if layout_cfg.coordinator else 0
    inference = int(getattr(layout_cfg, "inference", 0))
    fixed = {name: int(configured[name]) for name in _ROLE_NAMES if name not in rest}
    terms = [counted(number, name[:-1]) for name, number in fixed.items() if number or name == "trainers"]
    if inference:
        terms.append(counted(inference, "inference rank"))
    if coordinators:
        terms.append("1 coordinator")
    needed = sum(fixed.values()) + inference + coordinators
    if rest:
        left = world_size - needed
        if left < 0:
            raise LayoutError(
                f"layout needs {' + '.join(terms)} = {counted(needed, 'rank')} before "
                f"the 'rest' {rest[0]}, but the job has {world_size}"
            )
        fixed[rest[0]] = left
    elif needed != world_size:
        if needed > world_size:
            raise LayoutError(
                f"layout needs {' + '.join(terms)} = {counted(needed, 'rank')} but the job has {world_size}"
            )
        raise LayoutError(
            f"layout accounts for {' + '.join(terms)} = {counted(needed, 'rank')} but the job has {world_size}",
            fix=f"give one count as 'rest' or start {needed} ranks",
        )
    counts = LayoutCounts(fixed["trainers"], fixed["actors"], fixed["buffers"], bool(coordinators), inference)
    _check_counts(world_size, counts, layout_cfg.agent_groups, rest[0] if rest else None)
    if inference > counts.actors:
        raise LayoutError(
            f"layout.inference is {inference} but the layout has {counted(counts.actors, 'actor')}: "
            "every inference rank serves at least one actor"
        )
    return counts


def _check_counts(world_size: int, counts: LayoutCounts, groups: int, rest: str | None) -> None:
    if counts.trainers == 0:
        if rest == "trainers":
            others = " - ".join(
                [counted(world_size, "rank")]
                + [
                    counted(number, noun)
                    for number, noun in (
                        (counts.actors, "actor"),
                        (counts.buffers, "buffer"),
                        (int(counts.coordinator), "coordinator"),
                    )
                    if number
                ]
            )
            raise LayoutError(
                f"no rank is left for the 'rest' trainers: {others} = 0 trainers; at least one trainer is needed"
            )
        raise LayoutError("layout has 0 trainers; at least one trainer is needed")
    if groups < 1:
        raise LayoutError(f"the number of agent groups must be >= 1, found {groups}")
    if counts.trainers % groups:
        raise LayoutError(
            f"{counted(counts.trainers, 'trainer')} cannot be split into {groups} "
            f"equal agent groups ({counts.trainers} is not a multiple of {groups})"
        )
    if counts.actors and not counts.buffers:
        raise LayoutError(
            f"{counted(counts.actors, 'actor')} but no buffer: actors send their "
            "trajectories to a buffer, so at least one buffer is needed"
        )
    if counts.buffers > counts.clients:
        raise LayoutError(
            f"{counted(counts.buffers, 'buffer')} but only "
            f"{counted(counts.trainers, 'trainer')} + {counted(counts.actors, 'actor')}"
            f" = {counted(counts.clients, 'client')} to serve: every buffer needs at "
            "least one client"
        )


def fitting_world_sizes(layout_cfg: LayoutConfig, *, up_to: int = 256) -> list[int]:
    """The world sizes ``1..up_to`` whose counts this layout can fill (block arithmetic).

    Host-dependent rules of ``node-local`` placement are not applied: they need
    the host of every rank.
    """
    sizes = []
    for world_size in range(1, up_to + 1):
        try:
            resolve_counts(world_size, layout_cfg)
        except LayoutError:
            continue
        sizes.append(world_size)
    return sizes


def describe_fit(layout_cfg: LayoutConfig, *, up_to: int = 256) -> str:
    """Which ``-n`` fits this layout: ``"-n 4"``, ``"-n 3 or more"``, ``"-n 2 or 3"``, ``"-n 2, 4, 6, 8, ..."``,
    or why none."""
    sizes = fitting_world_sizes(layout_cfg, up_to=up_to)
    if not sizes:
        return f"no number of ranks up to {up_to} fits these counts"
    if sizes == list(range(sizes[0], up_to + 1)):
        return f"-n {sizes[0]}" if sizes[0] == up_to else f"-n {sizes[0]} or more"
    if len(sizes) == 1:
        return f"-n {sizes[0]}"
    if len(sizes) > 4:
        return f"-n {', '.join(str(size) for size in sizes[:4])}, ..."
    return f"-n {', '.join(str(size) for size in sizes[:-1])} or {sizes[-1]}"
