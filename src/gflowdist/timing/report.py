"""The end-of-run report: load imbalance per role and phase, waits, staleness, ledger, curves.

The runtime gathers plain dicts from every rank and calls::

    report = build_report(
        per_rank,                 # {rank: StepTimer.to_dict()}
        roles={0: "trainer", 1: "trainer", 2: "buffer"},
        hosts={0: "node-a", 1: "node-a", 2: "node-b"},
        ledger={0: {"produced": 120, "sent": 120, "dropped": {}, "in_flight": 0}, ...},
        staleness={0: {"0": 90, "1": 30}, ...},       # consumer rank -> {staleness: count}
        metrics=[{"step": 0, "loss": 2.3}, ...],
    )
    print(report.to_text())
    report.save(run_dir)          # report.txt, report.json, report.png

Rank keys may be ``int`` or decimal ``str`` everywhere (msgpack and JSON turn
int keys into strings). The formulas are in :mod:`gflowdist.timing.imbalance`
(load imbalance, waits) and :mod:`gflowdist.timing.summaries` (staleness,
ledger balance, metric summaries); ``docs/report.md`` shows an example.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gflowdist.errors import GflowdistError
from gflowdist.timing.collectives import CollectiveWaits, collective_lines
from gflowdist.timing.imbalance import PhaseImbalance, WaitMatrix
from gflowdist.timing.inference_lines import inference_lines, inference_stragglers
from gflowdist.timing.summaries import (
    LedgerSummary,
    MetricSummary,
    StalenessSummary,
    ledger_summary,
    staleness_summary,
)
from gflowdist.timing.text_table import rank_list, table_lines
from gflowdist.timing.timers import parse_rank
from gflowdist.timing.whole_run import generation_lines

__all__ = ["Report", "SavedReport", "by_rank", "REPORT_FORMAT", "UNKNOWN_ROLE", "MATRIX_MAX_RANKS"]

logger = logging.getLogger(__name__)

#: Version of :meth:`Report.to_dict`'s layout.
REPORT_FORMAT = 1
#: Role shown for a rank that has timings but no entry in ``roles``.
UNKNOWN_ROLE = "unknown"
#: Above this many ranks the wait matrix is printed as its largest cells, not a grid.
MATRIX_MAX_RANKS = 16
_TOP_PAIRS = 20


def by_rank(data: Mapping[Any, Any] | None, where: str) -> dict[int, Any]:
    """``data`` keyed by rank number (keys parsed as :func:`~gflowdist.timing.timers.parse_rank` does);
    None is empty; ``where`` names the argument in errors."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise GflowdistError(f"{where} must be a mapping {{rank: ...}}, got {type(data).__name__}")
    return {parse_rank(k, where): v for k, v in data.items()}


def _secs(value: float) -> str:
    return f"{value:.3f}"


def _cell(value: float) -> str:
    return "." if value == 0.0 else f"{value:.3f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


@dataclass(frozen=True)
class SavedReport:
    """What :meth:`Report.save` wrote; ``png_skipped`` says why there is no PNG (else None)."""

    paths: tuple[Path, ...]
    png_skipped: str | None


@dataclass(frozen=True)
class Report:
    """A finished run's report. Build it with :func:`build_report`.

    Attributes:
        ranks: every rank named by timings, roles, hosts, ledger or staleness.
        roles / hosts: ``{rank: name}``.
        imbalance: ``{role: (PhaseImbalance per phase, ...)}`` in rank order of roles.
        waits: the who-waited-on-whom matrix (point-to-point waits and collective waits).
        collectives: each collective's last arrivers and the waits on them.
        staleness: ``{consumer rank: StalenessSummary}``.
        ledger: the ledger table, or None when no ledger was given.
        curves: ``{metric: {"x": [...], "y": [...]}}`` (``None`` for non-finite y).
        metrics: first/last/best of each metric.
        notes: caveats found while building (missing timings, uneven iterations...).
        generation: the run's generation this report is of (0: its first).
        generations: the whole run's generations, ``generations.json``'s entries
            (:mod:`gflowdist.runtime.history`), shown when there is more than one.
        unit: what the ledger counts (trajectories, transitions...).
        shown_curves: the curves the figure draws, in order (``report.curves``; empty: its own choice).
    """

    ranks: tuple[int, ...]
    roles: Mapping[int, str]
    hosts: Mapping[int, str]
    imbalance: Mapping[str, tuple[PhaseImbalance, ...]]
    waits: WaitMatrix
    staleness: Mapping[int, StalenessSummary]
    ledger: LedgerSummary | None
    curves: Mapping[str, Mapping[str, Sequence[Any]]]
    metrics: tuple[MetricSummary, ...]
    notes: tuple[str, ...]
    collectives: tuple[CollectiveWaits, ...] = ()
    generation: int = 0
    generations: tuple[Mapping[str, Any], ...] = ()
    unit: str = "trajectories"
    shown_curves: tuple[str, ...] = ()
    #: a failed run's report is partial: the failure's lines, shown first (empty: the run ended normally)
    failure: tuple[str, ...] = ()
    #: each inference rank's batches and queueing delays (``layout.inference``; timing.inference_lines)
    inference: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)

    # --- plain data -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/msgpack-able data (rank keys as ``str``); inverse of :meth:`from_dict`."""
        return {
            "format": REPORT_FORMAT,
            "ranks": list(self.ranks),
            "roles": {str(r): v for r, v in self.roles.items()},
            "hosts": {str(r): v for r, v in self.hosts.items()},
            "imbalance": {role: [p.to_dict() for p in phases] for role, phases in self.imbalance.items()},
            "waits": self.waits.to_dict(),
            "staleness": {str(r): s.to_dict() for r, s in self.staleness.items()},
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
            "curves": {name: {"x": list(c["x"]), "y": list(c["y"])} for name, c in self.curves.items()},
            "metrics": [m.to_dict() for m in self.metrics],
            "notes": list(self.notes),
            "collectives": [c.to_dict() for c in self.collectives],
            "generation": self.generation,
            "generations": [dict(g) for g in self.generations],
            "unit": self.unit,
            "shown_curves": list(self.shown_curves),
            **({"partial": True, "failure": list(self.failure)} if self.failure else {}),
            **({"inference": {str(r): dict(s) for r, s in self.inference.items()}} if self.inference else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Rebuild a report from :meth:`to_dict` output (for example a loaded report.json)."""
        try:
            return cls._from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise GflowdistError(f"report data is malformed: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any]) -> Report:
        if data.get("format") != REPORT_FORMAT:
            raise GflowdistError(f"report format {data.get('format')!r} is not supported (expected {REPORT_FORMAT})")
        staleness = {r: staleness_summary(h, r) for r, h in by_rank(data["staleness"], "staleness").items()}
        return cls(
            ranks=tuple(int(r) for r in data["ranks"]),
            roles={r: str(v) for r, v in by_rank(data["roles"], "roles").items()},
            hosts={r: str(v) for r, v in by_rank(data["hosts"], "hosts").items()},
            imbalance={
                str(role): tuple(PhaseImbalance.from_dict(p) for p in phases)
                for role, phases in data["imbalance"].items()
            },
            waits=WaitMatrix.from_dict(data["waits"]),
            staleness=staleness,
            ledger=None if data["ledger"] is None else ledger_summary(data["ledger"]),
            curves={str(n): {"x": list(c["x"]), "y": list(c["y"])} for n, c in data["curves"].items()},
            metrics=tuple(MetricSummary.from_dict(m) for m in data["metrics"]),
            notes=tuple(str(n) for n in data["notes"]),
            collectives=tuple(CollectiveWaits.from_dict(c) for c in data.get("collectives", ())),
            generation=int(data.get("generation", 0)),
            generations=tuple(dict(g) for g in data.get("generations", ())),
            unit=str(data.get("unit", "trajectories")),
            shown_curves=tuple(str(c) for c in data.get("shown_curves", ())),
            failure=tuple(str(line) for line in data.get("failure", ())),
            inference={int(r): dict(s) for r, s in data.get("inference", {}).items()},
        )

    def to_json(self, *, indent: int | None = 1) -> str:
        """:meth:`to_dict` as strict JSON (no NaN)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))

    # --- text -----------------------------------------------------------------------

    def _who(self, rank: int) -> str:
        return f"{rank} {self.roles.get(rank, UNKNOWN_ROLE)}"

    def to_text(self) -> str:
        """The human-readable report (sections described in ``docs/report.md``)."""
        title = "gflowdist run report" + (f" -- generation {self.generation}" if self.generation else "")
        if self.failure:  # a failed run: what the ranks held when it ended, the failure first
            title += " -- PARTIAL: the run failed"
        lines = [title, "=" * len(title), *self.failure, *([""] if self.failure else [])]
        lines += self._layout_lines()
        if len(self.generations) > 1:
            lines += ["", *generation_lines(self.generations)]
        lines += ["", *self._imbalance_lines()]
        lines += ["", *self._straggler_lines()]
        if self.inference:
            lines += ["", *inference_lines(self.inference, self.hosts)]
        lines += ["", *self._wait_lines()]
        lines += ["", *self._staleness_lines()]
        lines += ["", *self._ledger_lines()]
        lines += ["", *self._metric_lines()]
        if self.notes:
            lines += ["", "Notes", *(f"  - {note}" for note in self.notes)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _grouped(self, names: Mapping[int, str]) -> str:
        groups: dict[str, list[int]] = {}
        for rank in self.ranks:
            if rank in names:
                groups.setdefault(names[rank], []).append(rank)
        return " | ".join(f"{name}: {rank_list(ranks)}" for name, ranks in groups.items())

    def _layout_lines(self) -> list[str]:
        lines = [f"ranks: {len(self.ranks)} -- {self._grouped(self.roles) or 'no roles given'}"]
        if self.hosts:
            lines.append(f"hosts: {self._grouped(self.hosts)}")
        return lines

    def _imbalance_lines(self) -> list[str]:
        lines = [
            "Load imbalance per role and phase",
            "  per iteration: useful = mean over ranks, waiting = max - mean; summed;",
            "  waiting % = waiting / (useful + waiting)",
        ]
        if not self.imbalance:
            return [*lines, "  (no phase timings recorded)"]
        for role, phases in self.imbalance.items():
            timed = {r for p in phases for r in (*p.ranks, *p.missing_ranks)}
            untimed = [r for r, name in self.roles.items() if name == role and r not in timed]
            lines.append(
                f"[{role}] ranks {rank_list(sorted(timed))}"
                + (f" (no timings from {rank_list(untimed)})" if untimed else "")
            )
            rows = [
                [
                    p.phase,
                    str(p.iterations) if not p.uneven else f"{p.min_iterations}..{p.iterations}",
                    _secs(p.useful),
                    _secs(p.waiting),
                    f"{p.waiting_pct:.1f}",
                    "-"
                    if p.straggler is None
                    else f"rank {p.straggler} ({p.straggler_iterations}/{p.contested_iterations})",
                ]
                for p in phases
            ]
            lines += table_lines(
                ["phase", "iters", "useful s", "waiting s", "waiting %", "straggler (slowest/contested iters)"],
                rows,
                align="lrrrrl",
                indent="  ",
            )
        return lines

    def _straggler_lines(self) -> list[str]:
        lines = ["Stragglers (rank most often slowest per role and phase)"]
        for role, phases in self.imbalance.items():
            for p in phases:
                if p.straggler is None:
                    continue
                host = self.hosts.get(p.straggler)
                where = f"rank {p.straggler}" + (f" on {host}" if host else "")
                mean_busy = sum(p.busy.values()) / len(p.busy)
                lines.append(
                    f"  {role}/{p.phase}: {where} slowest in {p.straggler_iterations} of "
                    f"{p.contested_iterations} contested iterations; its time "
                    f"{_secs(p.busy[p.straggler])} s vs mean {_secs(mean_busy)} s"
                )
        lines += collective_lines(list(self.collectives), self.hosts)
        lines += inference_stragglers(self.inference, self.hosts)
        if len(lines) == 1:
            lines.append("  none (no phase had ranks with different times)")
        return lines

    def _wait_lines(self) -> list[str]:
        w = self.waits
        lines = [
            "Who waited on whom (seconds blocked; row = waiting rank, column = rank waited on;",
            "  '.' = never waited)",
        ]
        if not w.by_label:
            return [*lines, "  (no waits recorded)"]
        if len(w.ranks) <= MATRIX_MAX_RANKS:
            rows = [[self._who(r), *(_cell(w.seconds(r, p)) for p in w.ranks), _secs(w.waited(r))] for r in w.ranks]
            rows.append(["total", *(_secs(w.waited_on(p)) for p in w.ranks), _secs(w.total())])
            return lines + table_lines(["waiter \\ peer", *map(str, w.ranks), "total"], rows, indent="  ")
        rows = [[self._who(a), self._who(b), _secs(s)] for a, b, s in w.top_pairs(_TOP_PAIRS)]
        lines.append(f"  {len(w.ranks)} ranks: the {len(rows)} largest cells, total of all cells {_secs(w.total())} s")
        return lines + table_lines(["waiter", "waited on", "seconds"], rows, align="llr", indent="  ")

    def _staleness_lines(self) -> list[str]:
        lines = ["Staleness (learner version - trajectory version, per consumer rank)"]
        if not self.staleness:
            return [*lines, "  (no staleness histograms given)"]

        def row(name: str, s: StalenessSummary) -> list[str]:
            mean = s.mean
            return [
                name,
                str(s.count),
                "-" if mean is None else f"{mean:.2f}",
                *(str(v) if v is not None else "-" for v in (s.quantile(0.5), s.quantile(0.95), s.maximum)),
            ]

        rows = [row(self._who(r), s) for r, s in self.staleness.items()]
        overall = StalenessSummary({})
        for s in self.staleness.values():
            overall = overall.merged(s)
        rows.append(row("all", overall))
        return lines + table_lines(["consumer", "samples", "mean", "p50", "p95", "max"], rows, indent="  ")

    def _ledger_lines(self) -> list[str]:
        lines = [f"Ledger ({self.unit})"]
        if self.ledger is None:
            return [*lines, "  (no ledger given)"]
        reasons = self.ledger.reasons
        used_here = self.ledger.total.used_locally > 0  # a column only where trainers learn without a buffer

        def row(name: str, e: Any) -> list[str]:
            return [
                name,
                str(e.produced),
                str(e.sent),
                *([str(e.used_locally)] if used_here else []),
                str(e.received),
                str(e.admitted),
                *(str(e.dropped.get(reason, 0)) for reason in reasons),
                str(e.in_flight),
            ]

        rows = [row(self._who(r), e) for r, e in self.ledger.rows.items()]
        rows.append(row("total", self.ledger.total))
        headers = [
            "rank",
            "produced",
            "sent",
            *(["used here"] if used_here else []),
            "received",
            "admitted",
            *(f"dropped:{reason}" for reason in reasons),
            "in flight",
        ]
        return lines + table_lines(headers, rows, indent="  ") + [f"  {self.ledger.balance_line()}"]

    def _metric_lines(self) -> list[str]:
        lines = ["Training curves (first / last / best finite value, @ step)"]
        if not self.metrics:
            return [*lines, "  (no metrics given)"]

        def at(p: tuple[float, float] | None) -> str:
            return "-" if p is None else f"{_num(p[1])} @{_num(p[0])}"

        rows = [
            [
                m.name,
                str(m.count - m.nonfinite) + (f" (+{m.nonfinite} non-finite)" if m.nonfinite else ""),
                at(m.first),
                at(m.last),
                f"{at(m.best)} ({m.goal})",
            ]
            for m in self.metrics
        ]
        return lines + table_lines(["metric", "points", "first", "last", "best"], rows, indent="  ")

    # --- files ----------------------------------------------------------------------

    def save(self, run_dir: str | os.PathLike[str], *, figure: bool = True) -> SavedReport:
        """Write ``report.txt``, ``report.json`` and, when matplotlib imports and ``figure``, ``report.png``.

        The directory is created if needed; each file is written to a temporary
        name and renamed, so a reader never sees half a file. Without
        matplotlib the PNG is skipped, the reason is logged at WARNING and
        returned in :attr:`SavedReport.png_skipped`.
        """
        from gflowdist.timing.figure import figure_unavailable_reason, save_figure

        directory = Path(run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        paths = [
            _write_text(directory / "report.txt", self.to_text() + "\n"),
            _write_text(directory / "report.json", self.to_json() + "\n"),
        ]
        if not figure:  # report.figure: false (a stale figure of an earlier generation would mislead)
            (directory / "report.png").unlink(missing_ok=True)
            return SavedReport(tuple(paths), "report.figure is false")
        reason = figure_unavailable_reason()
        if reason is None:
            paths.append(save_figure(self, directory / "report.png"))
        else:
            logger.warning("report.png skipped: %s", reason)
        return SavedReport(tuple(paths), reason)


def _write_text(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
