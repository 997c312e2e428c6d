"""The run's end on one screen: the headline figures of a :class:`~gflowdist.timing.Report`.

A run prints these lines, not its whole report (that stays in ``report.txt``
and ``gflowdist report RUN_DIR``)::

    gflowdist: 28.0 s, 686 trajectories/s
    gflowdist: busiest: rank 1 trainer, busy 84% of its time (rollout 9.7 s, sync 6.5 s, loss 6.4 s)
    gflowdist: most waiting: rank 0 trainer, blocked 4.7 s (4.3 s on rank 1 trainer)
    gflowdist: ledger: balanced -- 19200 produced = 0 used locally + 19200 received + 0 in flight; ...
    gflowdist: loss 5.233 -> 0.001745  l1 1.598 -> 0.1256  log_z 0.1 -> 3.118
    gflowdist: report runs/x/report.txt  (the whole report; again: gflowdist report runs/x)
    gflowdist: figure runs/x/report.png
    gflowdist: trace  runs/x/trace.json  (open in ui.perfetto.dev)

*Busy* is a rank's time in its phases less its idle ones (:func:`idle_phase`:
``idle`` and ``wait*``) and less its seconds blocked on peers; its share is of
all its timed phases. *Most waiting* is
the rank blocked longest on peers (the wait matrix: receives and collectives).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gflowdist.timing.report import Report

__all__ = ["headline", "idle_phase", "rank_times"]

#: Metrics shown with their first and last value, at most.
MAX_METRICS = 5
#: Phases of the busiest rank named, at most.
MAX_PHASES = 3


def idle_phase(name: str) -> bool:
    """A phase in which a rank waits for work (``idle``, ``wait_replay``...), not one in which it works."""
    return name == "idle" or name.startswith("wait")


def rank_times(report: Report) -> dict[int, tuple[dict[str, float], float]]:
    """``{rank: ({busy phase: seconds}, idle seconds)}`` from the report's per-role phases.

    A rank's seconds blocked on peers (the wait matrix: a collective's wait is inside its phase) count
    as idle, and are taken from its busy phases in proportion.
    """
    out: dict[int, tuple[dict[str, float], float]] = {}
    for phases in report.imbalance.values():
        for p in phases:
            for rank, seconds in p.busy.items():
                busy, idle = out.setdefault(rank, ({}, 0.0))
                if idle_phase(p.phase):
                    out[rank] = (busy, idle + seconds)
                else:
                    busy[p.phase] = busy.get(p.phase, 0.0) + seconds
    for rank, (busy, idle) in out.items():
        total = sum(busy.values())
        blocked = min(report.waits.waited(rank), total)
        if total > 0 and blocked > 0:
            out[rank] = ({k: v * (1 - blocked / total) for k, v in busy.items()}, idle + blocked)
    return out


def _who(report: Report, rank: int) -> str:
    return f"rank {rank} {report.roles.get(rank, '?')}"


def _busiest(report: Report) -> str | None:
    times = {r: t for r, t in rank_times(report).items() if sum(t[0].values()) + t[1] > 0}
    if not times:
        return None

    def share(rank: int) -> float:
        busy, idle = times[rank]
        return sum(busy.values()) / (sum(busy.values()) + idle)

    rank = max(times, key=lambda r: (share(r), sum(times[r][0].values())))
    top = sorted(times[rank][0].items(), key=lambda kv: -kv[1])[:MAX_PHASES]
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in top)
    return f"busiest: {_who(report, rank)}, busy {100 * share(rank):.0f}% of its time ({phases})"


def _most_waiting(report: Report) -> str | None:
    w = report.waits
    if not w.by_label or w.total() <= 0:
        return None
    rank = max(w.ranks, key=w.waited)
    peer = max((p for p in w.ranks if p != rank), key=lambda p: w.seconds(rank, p), default=None)
    on = f" ({w.seconds(rank, peer):.1f} s on {_who(report, peer)})" if peer is not None else ""
    return f"most waiting: {_who(report, rank)}, blocked {w.waited(rank):.1f} s{on}"


def _metrics(report: Report) -> str | None:
    shown = [
        (m.name, m.first, m.last)
        for m in report.metrics
        if not m.name.startswith("trajectories") and m.first and m.last
    ][:MAX_METRICS]
    return "  ".join(f"{name} {first[1]:.4g} -> {last[1]:.4g}" for name, first, last in shown if first and last) or None


_FILES = {
    "report.txt": ("report", "  (the whole report; again: gflowdist report {run_dir})"),
    "report.png": ("figure", ""),
    "trace.json": ("trace", "  (open in ui.perfetto.dev)"),
}


def headline(
    report: Report,
    *,
    verdict: str,
    run_dir: str | Path,
    seconds: float | None = None,
    made: int | None = None,
    unit: str = "trajectories",
    files: Sequence[str] = ("report.txt", "report.png", "trace.json"),
    warnings: Sequence[str] = (),
) -> list[str]:
    """The lines of the module docstring, without the ``gflowdist:`` prefix; a line without data is left out.

    ``seconds``/``made``: this generation's wall time and items; ``files``: the run directory's files to name
    (those that exist); ``warnings``: lines a person must see (actors flooding the learners).
    """
    run_dir = Path(run_dir)
    lines = []
    if seconds is not None and seconds > 0:
        rate = f", {made / seconds:.0f} {unit}/s" if made is not None else ""
        lines.append(f"{seconds:.1f} s{rate}")
    lines += [line for line in (_busiest(report), _most_waiting(report)) if line]
    lines.append(verdict)
    lines += [line for line in (_metrics(report),) if line]
    lines += list(warnings)
    for name in files:
        if (run_dir / name).exists():
            label, why = _FILES.get(name, (name, ""))
            lines.append(f"{label:<7}{run_dir / name}{why.format(run_dir=run_dir)}")
    return lines
