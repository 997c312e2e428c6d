"""What a rank layout is: :class:`Role`, :class:`Layout` and one rank's view, :class:`RankPlacement`.

A :class:`Layout` is plain data computed by :func:`gflowdist.layout.plan_layout`;
nothing here talks to MPI or torch.distributed. The rank lists (``trainers``,
``actors``, ``buffers``) are in *placement order*: chunk by chunk, which is
ascending rank order for block placement and host by host for node-local
placement. Agent groups are consecutive slices of ``trainers`` in that order.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gflowdist.errors import LayoutError

__all__ = ["Role", "Layout", "RankPlacement"]


class Role(enum.Enum):
    """What one rank does. ``Role.TRAINER.value == "trainer"``."""

    TRAINER = "trainer"
    ACTOR = "actor"
    BUFFER = "buffer"
    COORDINATOR = "coordinator"
    #: runs the actors' policy for them, batched (``layout.inference``; :mod:`gflowdist.runtime.loops.inference`)
    INFERENCE = "inference"


@dataclass(frozen=True)
class RankPlacement:
    """Everything the layout says about one rank (what a DistributedContext needs).

    Fields that do not apply to the rank's role are ``None`` or empty:
    ``buffer`` for trainers and actors (``None`` when the layout has no buffers),
    ``clients`` for buffers, ``group``/``group_members`` for trainers and actors
    (an actor belongs to its trainer's group), ``trainer`` for actors and
    inference ranks, ``actors`` for trainers. With ``layout.inference``:
    ``inference`` is an actor's inference rank, ``served`` an inference rank's
    actors and ``inference_ranks`` a trainer's inference ranks (its weights go
    to them instead of its actors).
    """

    rank: int
    role: Role
    host: str | None
    buffer: int | None
    clients: tuple[int, ...]
    group: int | None
    group_members: tuple[int, ...]
    trainer: int | None
    actors: tuple[int, ...]
    coordinator: int | None
    pop_ranks: tuple[int, ...]
    inference: int | None = None
    served: tuple[int, ...] = ()
    inference_ranks: tuple[int, ...] = ()

    @property
    def is_pop_rank(self) -> bool:
        """True for the first trainer of an agent group (the group's POP-axis representative)."""
        return self.role is Role.TRAINER and bool(self.group_members) and self.group_members[0] == self.rank


@dataclass(frozen=True)
class Layout:
    """The role of every rank and who talks to whom.

    Mappings are read-only. ``buffer_of`` has an entry for every trainer and
    actor when there are buffers (none otherwise); ``clients_of`` for every
    buffer; ``group_of`` and ``actors_of`` for every trainer (``actors_of`` may
    map to ``()``); ``trainer_of`` for every actor and inference rank. ``note`` says when a
    requested placement was replaced (``fallback_to_block``). With inference
    ranks (``layout.inference``): ``inference_of`` maps each actor to the rank
    that runs its policy, ``served_by`` each inference rank to its actors.
    """

    world_size: int
    roles: tuple[Role, ...]
    trainers: tuple[int, ...]
    actors: tuple[int, ...]
    buffers: tuple[int, ...]
    coordinator: int | None
    buffer_of: Mapping[int, int]
    clients_of: Mapping[int, tuple[int, ...]]
    agent_groups: tuple[tuple[int, ...], ...]
    group_of: Mapping[int, int]
    actors_of: Mapping[int, tuple[int, ...]]
    trainer_of: Mapping[int, int]
    hosts: tuple[str, ...] | None
    placement: str
    note: str | None = None
    inference: tuple[int, ...] = ()
    inference_of: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    served_by: Mapping[int, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))

    # --- per-rank questions ----------------------------------------------

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise LayoutError(
                f"rank {rank!r} is outside the world of {self.world_size} ranks "
                f"(valid ranks are 0..{self.world_size - 1})"
            )

    def role_of(self, rank: int) -> Role:
        """The role of ``rank``."""
        self._check_rank(rank)
        return self.roles[rank]

    def host_of(self, rank: int) -> str | None:
        """The host name of ``rank``, or ``None`` when no host names were given."""
        self._check_rank(rank)
        return self.hosts[rank] if self.hosts is not None else None

    def agent_group_of(self, rank: int) -> int | None:
        """Group index of a trainer, or of an actor's trainer; ``None`` for other roles."""
        self._check_rank(rank)
        if rank in self.group_of:
            return self.group_of[rank]
        if rank in self.trainer_of:
            return self.group_of[self.trainer_of[rank]]
        return None

    def ranks_of(self, role: Role) -> tuple[int, ...]:
        """All ranks with ``role``, in placement order."""
        if role is Role.COORDINATOR:
            return () if self.coordinator is None else (self.coordinator,)
        if role is Role.INFERENCE:
            return self.inference
        return {Role.TRAINER: self.trainers, Role.ACTOR: self.actors, Role.BUFFER: self.buffers}[role]

    @property
    def pop_ranks(self) -> tuple[int, ...]:
        """The first trainer of every agent group (EvoRL's POP axis runs across them)."""
        return tuple(group[0] for group in self.agent_groups)

    def for_rank(self, rank: int) -> RankPlacement:
        """Everything about ``rank`` in one object."""
        role = self.role_of(rank)
        group = self.agent_group_of(rank)
        return RankPlacement(
            rank=rank,
            role=role,
            host=self.host_of(rank),
            buffer=self.buffer_of.get(rank),
            clients=self.clients_of.get(rank, ()),
            group=group,
            group_members=self.agent_groups[group] if group is not None else (),
            trainer=self.trainer_of.get(rank),
            actors=self.actors_of.get(rank, ()),
            coordinator=self.coordinator,
            pop_ranks=self.pop_ranks,
            inference=self.inference_of.get(rank),
            served=self.served_by.get(rank, ()),
            inference_ranks=tuple(i for i in self.inference if self.trainer_of.get(i) == rank),
        )

    # --- output ----------------------------------------------------------

    def summary(self) -> str:
        """One line: ``world of 8 ranks: 5 trainers, 0 actors, 3 buffers, no coordinator; ...``."""
        coordinator = "no coordinator" if self.coordinator is None else f"coordinator {self.coordinator}"
        groups = len(self.agent_groups)

        def count(n: int, noun: str) -> str:
            return f"{n} {noun}{'s' if n != 1 else ''}"

        return (
            f"world of {count(self.world_size, 'rank')}: "
            f"{count(len(self.trainers), 'trainer')}, {count(len(self.actors), 'actor')}, "
            f"{count(len(self.buffers), 'buffer')}, "
            f"{count(len(self.inference), 'inference rank') + ', ' if self.inference else ''}{coordinator}; "
            f"{groups} agent group{'s' if groups != 1 else ''}; placement {self.placement}"
        )

    def _links(self, rank: int) -> str:
        role = self.roles[rank]
        if role is Role.BUFFER:
            return "clients " + ",".join(map(str, self.clients_of[rank]))
        if role is Role.ACTOR:
            inference = self.inference_of.get(rank)
            return f"trainer {self.trainer_of[rank]}" + ("" if inference is None else f", inference {inference}")
        if role is Role.INFERENCE:
            return f"trainer {self.trainer_of[rank]}, actors " + ",".join(map(str, self.served_by[rank]))
        if role is Role.TRAINER and self.actors_of.get(rank):
            return "actors " + ",".join(map(str, self.actors_of[rank]))
        return ""

    def describe(self) -> str:
        """A table of every rank: rank, role, host, buffer, group, and its links.

        The first line is :meth:`summary`; a fallback note, if any, comes last.
        """
        header = ("rank", "role", "host", "buffer", "group", "links")
        rows = [header]
        for rank in range(self.world_size):
            group = self.agent_group_of(rank)
            buffer = self.buffer_of.get(rank)
            rows.append(
                (
                    str(rank),
                    self.roles[rank].value,
                    self.hosts[rank] if self.hosts is not None else "-",
                    "-" if buffer is None else str(buffer),
                    "-" if group is None else str(group),
                    self._links(rank),
                )
            )
        widths = [max(len(row[col]) for row in rows) for col in range(len(header))]
        lines = [self.summary()]
        for row in rows:
            cells = [row[0].rjust(widths[0])] + [
                cell.ljust(width) for cell, width in zip(row[1:], widths[1:], strict=False)
            ]
            lines.append("  ".join(cells).rstrip())
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (roles as strings, int keys, lists): for msgpack, JSON, logs."""
        return {
            "world_size": self.world_size,
            "placement": self.placement,
            "roles": [role.value for role in self.roles],
            "trainers": list(self.trainers),
            "actors": list(self.actors),
            "buffers": list(self.buffers),
            "coordinator": self.coordinator,
            "buffer_of": dict(self.buffer_of),
            "clients_of": {rank: list(clients) for rank, clients in self.clients_of.items()},
            "agent_groups": [list(group) for group in self.agent_groups],
            "group_of": dict(self.group_of),
            "actors_of": {rank: list(actors) for rank, actors in self.actors_of.items()},
            "trainer_of": dict(self.trainer_of),
            "pop_ranks": list(self.pop_ranks),
            "hosts": list(self.hosts) if self.hosts is not None else None,
            "note": self.note,
            "inference": list(self.inference),
            "inference_of": dict(self.inference_of),
            "served_by": {rank: list(actors) for rank, actors in self.served_by.items()},
        }
