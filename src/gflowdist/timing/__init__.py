"""Per-rank timers and the end-of-run load-imbalance report.

- :mod:`~gflowdist.timing.timers`: ``StepTimer`` (phases, waits on peers, the
  seconds of each collective). No communication.
- :mod:`~gflowdist.timing.rates`: ``Throughput`` (EMA rate), ``eta_seconds``, ``format_duration``.
- :mod:`~gflowdist.timing.collectives`: who arrived last at each collective, and who waited on it.
- :mod:`~gflowdist.timing.trace`: a rank's timeline events (a ring) and ``trace.json`` (Chrome trace format).
- :mod:`~gflowdist.timing.imbalance`: useful vs waiting per phase, stragglers,
  the who-waited-on-whom matrix.
- :mod:`~gflowdist.timing.torchgfn_reports`: torchgfn's ``report_load_imbalance`` /
  ``report_time_info``, returning their tables.
- :mod:`~gflowdist.timing.summaries`: staleness, ledger balance, metric summaries.
- :mod:`~gflowdist.timing.report_build`: ``build_report`` -> :mod:`~gflowdist.timing.report`'s ``Report`` (text, JSON, save).
- :mod:`~gflowdist.timing.figure`: ``report.png`` (matplotlib, imported only to draw it).
"""

from __future__ import annotations

from gflowdist.timing.imbalance import PhaseImbalance, WaitMatrix, imbalance_by_phase, phase_imbalance, wait_matrix
from gflowdist.timing.rates import Throughput, eta_seconds, format_duration
from gflowdist.timing.report import Report, SavedReport
from gflowdist.timing.report_build import build_report
from gflowdist.timing.summaries import (
    LedgerRow,
    LedgerSummary,
    MetricSummary,
    StalenessSummary,
    ledger_summary,
    staleness_summary,
)
from gflowdist.timing.timers import StepTimer
from gflowdist.timing.torchgfn_reports import (
    LoadImbalanceResult,
    StepTime,
    TimeInfoResult,
    report_load_imbalance,
    report_time_info,
)

__all__ = [
    "StepTimer",
    "Throughput",
    "eta_seconds",
    "format_duration",
    "PhaseImbalance",
    "phase_imbalance",
    "imbalance_by_phase",
    "WaitMatrix",
    "wait_matrix",
    "LoadImbalanceResult",
    "TimeInfoResult",
    "StepTime",
    "report_load_imbalance",
    "report_time_info",
    "StalenessSummary",
    "staleness_summary",
    "LedgerRow",
    "LedgerSummary",
    "ledger_summary",
    "MetricSummary",
    "Report",
    "SavedReport",
    "build_report",
]
