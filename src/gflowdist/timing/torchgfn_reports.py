"""torchgfn's ``report_load_imbalance`` and ``report_time_info``, returning their tables.

Same columns and semantics as ``gfn.utils.distributed`` (the arithmetic is
:mod:`gflowdist.timing.imbalance`'s); each line is also logged at INFO like
torchgfn, and the numbers come back in a result object instead of only a log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gflowdist.errors import GflowdistError
from gflowdist.timing.imbalance import PhaseImbalance, imbalance_by_phase
from gflowdist.timing.text_table import rank_list
from gflowdist.timing.timers import as_time_list, parse_rank

__all__ = ["LoadImbalanceResult", "TimeInfoResult", "StepTime", "report_load_imbalance", "report_time_info"]

logger = logging.getLogger(__name__)


def _timing_list(
    all_timing_dict: Sequence[Mapping[str, Any]] | Mapping[Any, Mapping[str, Any]], world_size: int
) -> dict[int, dict[str, list[float]]]:
    """``{rank: {step: [seconds]}}`` for ranks ``0 .. world_size-1``, validated."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise GflowdistError(f"world_size must be an int >= 1, got {world_size!r}")
    if isinstance(all_timing_dict, Mapping):
        by_rank = {parse_rank(k, "all_timing_dict"): v for k, v in all_timing_dict.items()}
    else:
        by_rank = dict(enumerate(all_timing_dict))
    absent = [r for r in range(world_size) if r not in by_rank]
    if absent:
        raise GflowdistError(
            f"all_timing_dict has no timing dict for ranks {rank_list(absent)} of "
            f"world_size {world_size} (got {len(by_rank)} entries)"
        )
    out: dict[int, dict[str, list[float]]] = {}
    for rank in range(world_size):
        timing = by_rank[rank]
        if not isinstance(timing, Mapping):
            raise GflowdistError(
                f"timing dict of rank {rank} must be a mapping {{step_name: [seconds]}}, got {type(timing).__name__}"
            )
        out[rank] = {str(step): as_time_list(times, str(step)) for step, times in timing.items()}
    return out


@dataclass(frozen=True)
class LoadImbalanceResult:
    """What :func:`report_load_imbalance` computed; ``text`` is the table it logged."""

    phases: tuple[PhaseImbalance, ...]
    notes: tuple[str, ...]
    text: str

    def __str__(self) -> str:
        return self.text

    def phase(self, name: str) -> PhaseImbalance:
        """The row of step ``name``; KeyError if no rank recorded it."""
        for row in self.phases:
            if row.phase == name:
                return row
        raise KeyError(name)


def report_load_imbalance(
    all_timing_dict: Sequence[Mapping[str, Any]] | Mapping[Any, Mapping[str, Any]],
    world_size: int,
) -> LoadImbalanceResult:
    """torchgfn's ``report_load_imbalance``, returning the table instead of only logging it.

    Args:
        all_timing_dict: ``[rank0_dict, rank1_dict, ...]`` (or ``{rank: dict}``) where
            each dict is ``{"step_name": [iter0_time, iter1_time, ...], ...}``; a bare
            number counts as one iteration.
        world_size: ranks ``0 .. world_size-1`` are reported; each must have an entry.

    Same columns and semantics as torchgfn (per iteration useful = mean over
    ranks, waiting = max - mean, summed), plus ``waiting %`` and the straggler.
    Differences: a step missing on some ranks is computed over the ranks that
    have it (torchgfn skips it); ranks with fewer iterations join only the
    iterations they reached (torchgfn raises IndexError or ignores the extra);
    steps recorded only by ranks other than 0 are reported too. Each line of
    ``text`` is also logged at INFO, each note at WARNING, like torchgfn.
    """
    timing = _timing_list(all_timing_dict, world_size)
    phases = tuple(imbalance_by_phase(timing, range(world_size)))
    lines = [
        f"{'Step Name':<25} {'Useful Work':>12} {'Waiting':>12} {'Waiting %':>10}  Straggler",
        "-" * 80,
    ]
    for row in phases:
        straggler = (
            "-"
            if row.straggler is None
            else (f"rank {row.straggler} ({row.straggler_iterations}/{row.contested_iterations})")
        )
        lines.append(
            f"{row.phase:<25} {row.useful:>11.4f}s {row.waiting:>11.4f}s {row.waiting_pct:>9.1f}%  {straggler}"
        )
    notes = tuple(note for row in phases for note in row.notes())
    for line in lines:
        logger.info("%s", line)
    for note in notes:
        logger.warning("%s", note)
    return LoadImbalanceResult(phases, notes, "\n".join([*lines, *(f"note: {n}" for n in notes)]))


@dataclass(frozen=True)
class StepTime:
    """One rank's totals for one step: ``mean = total / iterations`` (None for 0 iterations)."""

    iterations: int
    total: float

    @property
    def mean(self) -> float | None:
        return self.total / self.iterations if self.iterations else None


@dataclass(frozen=True)
class TimeInfoResult:
    """What :func:`report_time_info` computed; ``text`` is what it logged.

    Attributes:
        per_rank: ``{rank: {step: StepTime}}``.
        maximum: ``{step: (largest per-rank total, that rank)}``.
        average: ``{step: mean of per-rank totals over the ranks that recorded it}``.
    """

    per_rank: Mapping[int, Mapping[str, StepTime]]
    maximum: Mapping[str, tuple[float, int]]
    average: Mapping[str, float]
    text: str

    def __str__(self) -> str:
        return self.text


def report_time_info(
    all_timing_dict: Sequence[Mapping[str, Any]] | Mapping[Any, Mapping[str, Any]],
    world_size: int,
) -> TimeInfoResult:
    """torchgfn's ``report_time_info``, returning the text and numbers instead of only logging.

    Per rank and step: mean seconds per iteration and total; then per step the
    maximum of the per-rank totals and their average over the ranks that
    recorded the step (as torchgfn). A step with no iterations reads
    ``no iterations`` instead of dividing by zero. Each line is also logged at INFO.
    """
    timing = _timing_list(all_timing_dict, world_size)
    per_rank: dict[int, dict[str, StepTime]] = {}
    totals: dict[str, list[tuple[float, int]]] = {}
    lines = ["Timing information for each rank:"]
    for rank in range(world_size):
        lines.append(f"Rank {rank} timing information:")
        per_rank[rank] = {}
        for step, times in timing[rank].items():
            st = StepTime(len(times), float(np.sum(times)) if times else 0.0)
            per_rank[rank][step] = st
            mean = "no iterations" if st.mean is None else f"{st.mean:.4f} seconds"
            lines.append(f"  {step}: {mean} (total: {st.total:.4f} seconds)")
            totals.setdefault(step, []).append((st.total, rank))
    maximum = {step: max(vals, key=lambda v: (v[0], -v[1])) for step, vals in totals.items()}
    average = {step: sum(v for v, _ in vals) / len(vals) for step, vals in totals.items()}
    lines += ["", "Maximum timing information:"]
    lines += [f"  {step}: {value:.4f} seconds (rank {rank})" for step, (value, rank) in maximum.items()]
    lines += ["", "Average timing information:"]
    lines += [f"  {step}: {value:.4f} seconds" for step, value in average.items()]
    for line in lines:
        logger.info("%s", line)
    return TimeInfoResult(per_rank, maximum, average, "\n".join(lines))
