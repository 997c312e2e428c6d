r"""Collective waits: for each collective, which member arrived last and how long each other one waited on it.

Each member of a group times its own part of every collective (from its
arrival to its departure, :meth:`StepTimer.collective`) and nothing else; no
clock is compared across ranks. A collective such as an all-reduce ends for
every member at about the same moment (no one leaves before the last one
arrived), so with ``d[r][i]`` the seconds member ``r`` spent in the group's
``i``-th collective of that name::

    last_i        = the member with the smallest d[r][i]   (ties: the lower rank)
    wait[r][i]    = d[r][i] - d[last_i][i]                  (>= 0; 0 for last_i itself)

``d[last_i][i]`` is the collective's own cost (the transfer everybody pays);
what a member spent beyond it, it spent waiting for the last arrival. The
estimate is exact when every member leaves at the same moment, and off by the
spread of the departures otherwise (a tree or ring algorithm releases members
a few microseconds apart). Clocks of different hosts never meet, so their
offsets do not matter.

The report adds ``wait[r][i]`` to the who-waited-on-whom matrix (row ``r``,
column ``last_i``, label ``collective:<name>``) and names in its straggler
list the member that arrived last most often.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gflowdist.timing.text_table import rank_list
from gflowdist.timing.timers import StepTimer

__all__ = ["CollectiveWaits", "collective_waits", "last_at", "add_to_matrix", "collective_lines", "LABEL_PREFIX"]

#: The wait matrix's label of collective waits: ``collective:<name>``.
LABEL_PREFIX = "collective:"


@dataclass(frozen=True)
class CollectiveWaits:
    """One named collective of one group, over the run.

    Attributes:
        name: the collective's name (``gradients``, ``stop_vote``, ...).
        group: the members' world ranks, ascending.
        count: collectives every member timed (``i`` runs over these).
        last: ``{rank: collectives it arrived last at}`` (ranks never last are absent).
        waited: ``{waiter: {last arriver: seconds}}``, summed over the collectives.
        seconds: ``{rank: total seconds in these collectives}``.
        missing: members that timed none of them (their seconds never arrived).
    """

    name: str
    group: tuple[int, ...]
    count: int
    last: Mapping[int, int]
    waited: Mapping[int, Mapping[int, float]]
    seconds: Mapping[int, float]
    missing: tuple[int, ...] = ()

    @property
    def straggler(self) -> int | None:
        """The member that arrived last most often (ties: the lower rank); None without collectives."""
        if not self.last:
            return None
        return min(self.last, key=lambda r: (-self.last[r], r))

    def waited_on(self, rank: int) -> float:
        """Seconds the other members spent waiting on ``rank``."""
        return sum(peers.get(rank, 0.0) for peers in self.waited.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": list(self.group),
            "count": self.count,
            "last": {str(r): n for r, n in self.last.items()},
            "waited": {str(w): {str(p): s for p, s in peers.items()} for w, peers in self.waited.items()},
            "seconds": {str(r): s for r, s in self.seconds.items()},
            "missing": list(self.missing),
            "straggler": self.straggler,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CollectiveWaits:
        return cls(
            name=str(data["name"]),
            group=tuple(int(r) for r in data["group"]),
            count=int(data["count"]),
            last={int(r): int(n) for r, n in data["last"].items()},
            waited={int(w): {int(p): float(s) for p, s in peers.items()} for w, peers in data["waited"].items()},
            seconds={int(r): float(s) for r, s in data["seconds"].items()},
            missing=tuple(int(r) for r in data.get("missing", ())),
        )


def collective_waits(timers: Mapping[int, StepTimer]) -> list[CollectiveWaits]:
    """Every (name, group) some rank timed, attributed (module docstring); sorted by name, then group."""
    keys = sorted({key for t in timers.values() for key in t.collectives})
    return [
        _attribute(
            name,
            group,
            {
                r: timers[r].collectives[(name, group)]
                for r in group
                if r in timers and (name, group) in timers[r].collectives
            },
        )
        for name, group in keys
    ]


def _attribute(name: str, group: tuple[int, ...], times: Mapping[int, list[float]]) -> CollectiveWaits:
    members = sorted(times)
    count = min((len(t) for t in times.values()), default=0) if len(members) == len(group) else 0
    last: dict[int, int] = {}
    waited: dict[int, dict[int, float]] = {}
    for i in range(count):
        found = last_at(times, i)
        if found is None:  # i < count: every member has collective i
            continue
        arrived_last, waits = found
        last[arrived_last] = last.get(arrived_last, 0) + 1
        for r in members:
            if r != arrived_last:
                peers = waited.setdefault(r, {})
                peers[arrived_last] = peers.get(arrived_last, 0.0) + waits[r]
    return CollectiveWaits(
        name, group, count, last, waited, {r: sum(times[r]) for r in members}, tuple(r for r in group if r not in times)
    )


def add_to_matrix(
    collectives: list[CollectiveWaits],
    by_label: dict[int, dict[int, dict[str, float]]],
    counts: dict[int, dict[int, dict[str, int]]],
) -> None:
    """Add each collective's waits to a wait matrix's cells, label ``collective:<name>``, in place.

    A cell's count is the number of waits, as for ``wait_on``: the collectives
    of the group at which ``peer`` arrived last (the waiter waited on it at
    each of them, if only for 0 s), not 1 per group.
    """
    for c in collectives:
        label = LABEL_PREFIX + c.name
        for waiter, peers in c.waited.items():
            for peer, seconds in peers.items():
                cell = by_label.setdefault(waiter, {}).setdefault(peer, {})
                cell[label] = cell.get(label, 0.0) + seconds
                n = counts.setdefault(waiter, {}).setdefault(peer, {})
                n[label] = n.get(label, 0) + c.last[peer]


def collective_lines(collectives: list[CollectiveWaits], hosts: Mapping[int, str]) -> list[str]:
    """The straggler list's lines for collectives: who arrived last most often, and what it cost the others."""
    lines = []
    for c in collectives:
        rank = c.straggler
        if rank is None:
            continue
        host = hosts.get(rank)
        where = f"rank {rank}" + (f" on {host}" if host else "")
        others = [r for r in c.group if r != rank]
        who = f"rank {others[0]}" if len(others) == 1 else f"the other {len(others)}"
        lines.append(
            f"  collective {c.name} of ranks {rank_list(c.group)}: {where} arrived last at "
            f"{c.last[rank]} of {c.count}; {who} waited {c.waited_on(rank):.3f} s on it "
            f"({sum(map(c.waited_on, c.group)):.3f} s waited in all of them)"
        )
    return lines


def last_at(times: Mapping[int, list[float]], index: int) -> tuple[int, dict[int, float]] | None:
    """The member that arrived last at collective ``index`` and each member's wait on it; None when a
    member's seconds of that collective are missing. ``times``: ``{member: seconds per collective}``."""
    if any(index >= len(t) for t in times.values()) or not times:
        return None
    durations = {r: t[index] for r, t in times.items()}
    arrived_last = min(durations, key=lambda r: (durations[r], r))
    return arrived_last, {r: d - durations[arrived_last] for r, d in durations.items()}
