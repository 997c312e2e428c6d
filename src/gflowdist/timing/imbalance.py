r"""Load imbalance: useful work vs waiting per phase, and who waited on whom.

Definitions (``t[r][i]`` = seconds rank ``r`` spent in a phase at its ``i``-th
iteration; ``R_i`` = the ranks that recorded an ``i``-th iteration)::

    mean_i    = sum(t[r][i] for r in R_i) / len(R_i)
    max_i     = max(t[r][i] for r in R_i)
    useful    = sum_i mean_i                      # work the average rank did
    waiting   = sum_i (max_i - mean_i)            # time the average rank idled
    waiting % = 100 * waiting / (useful + waiting)   # = waiting / sum_i max_i

``useful + waiting = sum_i max_i`` is the phase's wall time when ranks wait
for each other at the end of every iteration (a collective, a barrier), so
``waiting %`` is the share of that wall time lost to imbalance. With equal
iteration counts, ``useful`` is also the mean over ranks of each rank's total.

Per rank: ``busy[r] = sum_i t[r][i]`` and ``idle[r] = sum_i (max_i - t[r][i])``;
with equal iteration counts ``mean_r idle[r] == waiting``.

Straggler: iteration ``i`` names the lowest rank whose time equals ``max_i``,
unless every rank in ``R_i`` took the same time (including iterations only one
rank reached), which names nobody. A phase's straggler is the rank named most
often (ties: the lower rank); ``None`` when no iteration names anyone.

Ranks with different iteration counts: iteration ``i`` is averaged over the
ranks that reached it (``R_i``), never padded with zeros. A phase missing on
some ranks is computed over the ranks that have it; the others are listed in
``missing_ranks`` (torchgfn instead skips such a step entirely).

Who waited on whom: ``seconds(w, p)`` = total seconds rank ``w`` spent in
``StepTimer.wait_on(p, ...)`` blocks, over every label, plus the seconds it
waited in collectives on ``p`` arriving last (:mod:`gflowdist.timing.collectives`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gflowdist.timing.collectives import CollectiveWaits, add_to_matrix
from gflowdist.timing.text_table import rank_list
from gflowdist.timing.timers import StepTimer, parse_rank

__all__ = [
    "PhaseImbalance",
    "phase_imbalance",
    "imbalance_by_phase",
    "WaitMatrix",
    "wait_matrix",
]


def _rank_floats(data: Mapping[Any, Any], where: str) -> dict[int, float]:
    return {parse_rank(k, where): float(v) for k, v in data.items()}


@dataclass(frozen=True)
class PhaseImbalance:
    """Imbalance of one phase over a group of ranks (see the module docstring for formulas).

    Attributes:
        phase: the phase (torchgfn: step) name.
        ranks: ranks that recorded the phase, ascending.
        missing_ranks: ranks of the group that never recorded it.
        iterations: the largest iteration count among ``ranks``.
        min_iterations: the smallest; differs from ``iterations`` when counts are uneven.
        useful: ``sum_i mean_i`` seconds.
        waiting: ``sum_i (max_i - mean_i)`` seconds.
        straggler: the rank most often slowest, or None.
        straggler_iterations: in how many iterations ``straggler`` was named.
        contested_iterations: iterations that named a straggler at all.
        busy: ``{rank: sum_i t[r][i]}``.
        idle: ``{rank: sum_i (max_i - t[r][i])}`` over the iterations the rank reached.
    """

    phase: str
    ranks: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    iterations: int
    min_iterations: int
    useful: float
    waiting: float
    straggler: int | None
    straggler_iterations: int
    contested_iterations: int
    busy: Mapping[int, float] = field(default_factory=dict)
    idle: Mapping[int, float] = field(default_factory=dict)

    @property
    def waiting_pct(self) -> float:
        """``100 * waiting / (useful + waiting)``; 0.0 for a phase that took no time."""
        total = self.useful + self.waiting
        return 100.0 * self.waiting / total if total > 0.0 else 0.0

    @property
    def uneven(self) -> bool:
        """True when ranks recorded different numbers of iterations."""
        return self.min_iterations != self.iterations

    def notes(self) -> list[str]:
        """Human-readable caveats: missing ranks, uneven iteration counts."""
        out = []
        if self.missing_ranks:
            out.append(
                f"phase {self.phase!r} not recorded on ranks {rank_list(self.missing_ranks)}; "
                f"computed over ranks {rank_list(self.ranks)}"
            )
        if self.uneven:
            out.append(
                f"phase {self.phase!r} has uneven iteration counts "
                f"({self.min_iterations}..{self.iterations}); iteration i is averaged "
                f"over the ranks that reached it"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data (rank keys as ``str``); inverse of :meth:`from_dict`."""
        return {
            "phase": self.phase,
            "ranks": list(self.ranks),
            "missing_ranks": list(self.missing_ranks),
            "iterations": self.iterations,
            "min_iterations": self.min_iterations,
            "useful": self.useful,
            "waiting": self.waiting,
            "waiting_pct": self.waiting_pct,
            "straggler": self.straggler,
            "straggler_iterations": self.straggler_iterations,
            "contested_iterations": self.contested_iterations,
            "busy": {str(r): v for r, v in self.busy.items()},
            "idle": {str(r): v for r, v in self.idle.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PhaseImbalance:
        """Inverse of :meth:`to_dict` (``waiting_pct`` is recomputed, not read)."""
        return cls(
            phase=str(data["phase"]),
            ranks=tuple(int(r) for r in data["ranks"]),
            missing_ranks=tuple(int(r) for r in data["missing_ranks"]),
            iterations=int(data["iterations"]),
            min_iterations=int(data["min_iterations"]),
            useful=float(data["useful"]),
            waiting=float(data["waiting"]),
            straggler=None if data["straggler"] is None else int(data["straggler"]),
            straggler_iterations=int(data["straggler_iterations"]),
            contested_iterations=int(data["contested_iterations"]),
            busy=_rank_floats(data["busy"], "busy"),
            idle=_rank_floats(data["idle"], "idle"),
        )


def phase_imbalance(
    phase: str, times_by_rank: Mapping[int, Sequence[float]], group: Iterable[int] | None = None
) -> PhaseImbalance:
    """Useful work, waiting and straggler of one phase.

    Args:
        phase: name carried into the result.
        times_by_rank: ``{rank: [seconds of iteration 0, 1, ...]}`` for the ranks
            that recorded the phase (lists may differ in length, may be empty).
        group: every rank expected to record it; those absent from
            ``times_by_rank`` become ``missing_ranks``. Defaults to ``times_by_rank``'s ranks.
    """
    ranks = tuple(sorted(times_by_rank))
    missing = tuple(sorted(set(group) - set(ranks))) if group is not None else ()
    counts = [len(times_by_rank[r]) for r in ranks]
    n_iter = max(counts, default=0)
    grid = np.zeros((len(ranks), n_iter))
    present = np.zeros((len(ranks), n_iter), dtype=bool)
    for row, rank in enumerate(ranks):
        grid[row, : counts[row]] = np.asarray(times_by_rank[rank], dtype=float)
        present[row, : counts[row]] = True
    busy = {rank: float(grid[row].sum()) for row, rank in enumerate(ranks)}
    if n_iter == 0:
        return PhaseImbalance(phase, ranks, missing, 0, 0, 0.0, 0.0, None, 0, 0, busy, {rank: 0.0 for rank in ranks})

    # every column has >= 1 present rank because n_iter is the largest count
    col_max = np.where(present, grid, -np.inf).max(axis=0)
    col_min = np.where(present, grid, np.inf).min(axis=0)
    col_mean = grid.sum(axis=0) / present.sum(axis=0)
    useful = float(col_mean.sum())
    waiting = float(np.maximum(col_max - col_mean, 0.0).sum())
    idle_grid = np.where(present, col_max[None, :] - grid, 0.0)
    idle = {rank: float(idle_grid[row].sum()) for row, rank in enumerate(ranks)}

    contested = col_max > col_min
    slowest_row = np.argmax(np.where(present, grid, -np.inf), axis=0)  # first max = lowest rank
    wins = np.bincount(slowest_row[contested], minlength=len(ranks))
    straggler: int | None = None
    straggler_iterations = 0
    if contested.any():
        best = int(np.argmax(wins))
        straggler, straggler_iterations = ranks[best], int(wins[best])
    return PhaseImbalance(
        phase,
        ranks,
        missing,
        n_iter,
        min(counts),
        useful,
        waiting,
        straggler,
        straggler_iterations,
        int(contested.sum()),
        busy,
        idle,
    )


def imbalance_by_phase(
    timing_by_rank: Mapping[int, Mapping[str, Sequence[float]]], group: Iterable[int] | None = None
) -> list[PhaseImbalance]:
    """:func:`phase_imbalance` of every phase any rank recorded.

    Phases come in order of first appearance, scanning ranks in ascending order.
    ``group`` defaults to every rank of ``timing_by_rank``.
    """
    members = sorted(timing_by_rank) if group is None else sorted(set(group))
    order: dict[str, None] = {}
    for rank in sorted(timing_by_rank):
        order.update(dict.fromkeys(timing_by_rank[rank]))
    return [
        phase_imbalance(
            phase, {r: timing_by_rank[r][phase] for r in sorted(timing_by_rank) if phase in timing_by_rank[r]}, members
        )
        for phase in order
    ]


# --- who waited on whom ----------------------------------------------------------------


@dataclass(frozen=True)
class WaitMatrix:
    """Seconds each rank spent blocked on each peer.

    Attributes:
        ranks: every rank that waited or was waited on, ascending (rows and columns).
        by_label: ``{waiter: {peer: {label: seconds}}}``.
        counts: ``{waiter: {peer: {label: number of waits}}}``.
    """

    ranks: tuple[int, ...]
    by_label: Mapping[int, Mapping[int, Mapping[str, float]]]
    counts: Mapping[int, Mapping[int, Mapping[str, int]]]

    def seconds(self, waiter: int, peer: int) -> float:
        """Total seconds ``waiter`` was blocked on ``peer`` (all labels)."""
        return float(sum(self.by_label.get(waiter, {}).get(peer, {}).values()))

    def matrix(self) -> list[list[float]]:
        """``m[i][j] = seconds(ranks[i], ranks[j])``: rows wait, columns are waited on."""
        return [[self.seconds(w, p) for p in self.ranks] for w in self.ranks]

    def waited(self, waiter: int) -> float:
        """Row sum: all seconds ``waiter`` spent blocked."""
        return float(sum(self.seconds(waiter, p) for p in self.by_label.get(waiter, {})))

    def waited_on(self, peer: int) -> float:
        """Column sum: all seconds other ranks spent blocked on ``peer``."""
        return float(sum(self.seconds(w, peer) for w in self.by_label))

    def total(self) -> float:
        """Sum of every cell."""
        return float(sum(self.waited(w) for w in self.by_label))

    def top_pairs(self, n: int) -> list[tuple[int, int, float]]:
        """The ``n`` largest ``(waiter, peer, seconds)`` cells, largest first."""
        cells = [(w, p, self.seconds(w, p)) for w in self.by_label for p in self.by_label[w]]
        cells.sort(key=lambda c: (-c[2], c[0], c[1]))
        return cells[:n]

    def to_dict(self) -> dict[str, Any]:
        """``{"ranks": [...], "seconds": {"w": {"p": {label: s}}}, "counts": {...}}``."""
        return {
            "ranks": list(self.ranks),
            "seconds": {str(w): {str(p): dict(lab) for p, lab in peers.items()} for w, peers in self.by_label.items()},
            "counts": {str(w): {str(p): dict(lab) for p, lab in peers.items()} for w, peers in self.counts.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WaitMatrix:
        """Inverse of :meth:`to_dict`."""

        def nested(d: Mapping[str, Any], cast: type) -> dict[int, dict[int, dict[str, Any]]]:
            return {
                parse_rank(w, "wait matrix"): {
                    parse_rank(p, "wait matrix"): {str(k): cast(v) for k, v in lab.items()} for p, lab in peers.items()
                }
                for w, peers in d.items()
            }

        return cls(tuple(int(r) for r in data["ranks"]), nested(data["seconds"], float), nested(data["counts"], int))


def wait_matrix(timers: Mapping[int, StepTimer], collectives: Sequence[CollectiveWaits] = ()) -> WaitMatrix:
    """Collect every rank's ``StepTimer.waits``, and the waits on each collective's last arriver
    (label ``collective:<name>``, :mod:`gflowdist.timing.collectives`), into one :class:`WaitMatrix`."""
    by_label = {w: {p: dict(lab) for p, lab in t.waits.items()} for w, t in timers.items() if t.waits}
    counts = {w: {p: dict(lab) for p, lab in t.wait_counts.items()} for w, t in timers.items() if t.wait_counts}
    add_to_matrix(list(collectives), by_label, counts)
    ranks = set(by_label)
    for peers in by_label.values():
        ranks.update(peers)
    return WaitMatrix(tuple(sorted(ranks)), by_label, counts)
