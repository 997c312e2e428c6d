"""``build_report``: the run report (:class:`~gflowdist.timing.report.Report`) from what the runtime gathered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gflowdist.errors import GflowdistError
from gflowdist.timing.collectives import collective_waits
from gflowdist.timing.imbalance import PhaseImbalance, imbalance_by_phase, wait_matrix
from gflowdist.timing.report import UNKNOWN_ROLE, Report, by_rank
from gflowdist.timing.summaries import ledger_summary, metric_curves, metric_summaries, staleness_summary
from gflowdist.timing.text_table import rank_list
from gflowdist.timing.timers import StepTimer

__all__ = ["build_report"]


def _timer_of(rank: int, data: Any) -> StepTimer:
    try:
        return StepTimer.from_dict(data)
    except GflowdistError as exc:
        raise GflowdistError(f"timings of rank {rank}: {exc}") from exc


def _ranks(ranks: Sequence[int]) -> str:
    """``"rank 5 has"`` / ``"ranks 5-7 have"``."""
    return f"rank {ranks[0]} has" if len(ranks) == 1 else f"ranks {rank_list(ranks)} have"


def build_report(
    per_rank: Mapping[Any, Mapping[str, Any]],
    *,
    roles: Mapping[Any, str],
    hosts: Mapping[Any, str] | None = None,
    ledger: Mapping[Any, Mapping[str, Any]] | None = None,
    staleness: Mapping[Any, Mapping[Any, int]] | None = None,
    metrics: Sequence[Mapping[str, Any]] | None = None,
    goals: Mapping[str, str] | None = None,
) -> Report:
    """Build the run report from what the runtime gathered.

    Args:
        per_rank: ``{rank: StepTimer.to_dict()}`` of every rank that sent timings.
        roles: ``{rank: role name}``; a timed rank without a role is listed under
            ``"unknown"`` and noted; a rank with a role but no timings is noted.
        hosts: ``{rank: host name}``, optional.
        ledger: ``{rank: {"produced", "sent", "used_locally", "received", "admitted",
            "dropped": {reason: n}, "in_flight"}}``; absent keys count 0.
        staleness: ``{consumer rank: {staleness value (str or int): count}}``.
        metrics: rows ``{"step": x, "<metric>": value, ...}`` in time order.
        goals: ``{"<metric>": "min" | "max"}`` overriding which extreme is "best".

    Load imbalance is computed per role: each role's ranks form the group, so a
    phase recorded by some trainers but not others lists the others as missing.
    Raises :class:`GflowdistError` on malformed input, naming the rank and key.
    """
    timers = {r: _timer_of(r, d) for r, d in by_rank(per_rank, "per_rank").items()}
    role_of = {r: str(v) for r, v in by_rank(roles, "roles").items()}
    host_of = {r: str(v) for r, v in by_rank(hosts, "hosts").items()}
    ledger_rows = ledger_summary(by_rank(ledger, "ledger")) if ledger is not None else None
    stale = {r: staleness_summary(h, r) for r, h in sorted(by_rank(staleness, "staleness").items())}
    curves = metric_curves(list(metrics or []))

    notes: list[str] = []
    roleless = sorted(set(timers) - set(role_of))
    if roleless:
        notes.append(f"{_ranks(roleless)} timings but no role; listed as {UNKNOWN_ROLE!r}")
    silent = sorted(set(role_of) - set(timers))
    if silent:
        notes.append(f"{_ranks(silent)} a role but sent no timings")

    groups: dict[str, list[int]] = {}
    for rank in sorted(timers):
        groups.setdefault(role_of.get(rank, UNKNOWN_ROLE), []).append(rank)
    imbalance: dict[str, tuple[PhaseImbalance, ...]] = {}
    for role, members in groups.items():
        phases = imbalance_by_phase({r: timers[r].phases for r in members}, members)
        imbalance[role] = tuple(phases)
        notes += [f"{role}: {note}" for p in phases for note in p.notes()]

    collectives = collective_waits(timers)
    notes += [
        f"collective {c.name} of ranks {list(c.group)}: no seconds from rank(s) {rank_list(c.missing)}, "
        f"so its last arrivers are unknown"
        for c in collectives
        if c.missing
    ]
    waits = wait_matrix(timers, collectives)
    all_ranks = set(timers) | set(role_of) | set(host_of) | set(stale) | set(waits.ranks)
    if ledger_rows is not None:
        all_ranks |= set(ledger_rows.rows)
    return Report(
        ranks=tuple(sorted(all_ranks)),
        roles=dict(sorted(role_of.items())),
        hosts=dict(sorted(host_of.items())),
        imbalance=imbalance,
        waits=waits,
        staleness=stale,
        ledger=ledger_rows,
        curves=curves,
        metrics=tuple(metric_summaries(curves, goals)),
        notes=tuple(notes),
        collectives=tuple(collectives),
    )
