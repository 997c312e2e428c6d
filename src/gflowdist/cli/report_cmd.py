"""``gflowdist report RUN_DIR [--json] [--png PATH] [--tensorboard] [--timeline PNG [--window A:B]]``: show a
finished run's report again.

Every run ends with the collector writing ``report.json`` (via
:meth:`gflowdist.timing.Report.save`) and ``ledger.json`` into its run
directory (see :mod:`gflowdist.runtime.job`). This command reads both and
prints, in this order:

1. the text report, ``Report.from_dict(json.load(report.json)).to_text()``;
2. the ledger verdict of ``ledger.json``, one line::

       ledger: balanced -- 1280 produced = 0 used locally + 1280 received + 0 in flight; 1280 admitted, 0 dropped

   or ``ledger: NOT balanced -- <the coordinator's LedgerError message>``;
3. the run's final line, as the run printed it (``ledger.json["final_line"]``
   when the runtime stored it), else rebuilt from the totals of ``ledger.json``
   in the runtime's words (the stop reason is then unknown)::

       gflowdist: done: 1280 trajectories produced, 1280 admitted, 0 dropped, ledger balanced; run directory DIR

With ``--json`` stdout is one JSON object instead:
``{"run_dir", "report" (= Report.to_dict()), "ledger" (= ledger.json), "final_line"}``.
``--png PATH`` also draws the report's figure to ``PATH`` (with matplotlib, a
dependency of gflowdist). ``--tensorboard`` also writes the run's TensorBoard
event files into ``RUN_DIR/tensorboard/`` (as ``run.tensorboard: true`` does at
the end of a run; :mod:`gflowdist.timing.tensorboard`), replacing earlier ones.
``--timeline PNG`` draws a stretch of the run's ``trace.json`` (``run.trace``, on by default)
to ``PNG`` (:mod:`gflowdist.timing.trace_figure`): ``--window START_MS:END_MS``
of the trace's time line, by default 150 ms from its middle; a window outside
the trace's time span is refused (exit 2) with one line naming that span.

A run that failed has a partial report (its post-mortem,
:mod:`gflowdist.runtime.postmortem`): the failure at the top of the text,
``ledger: not checked -- the run failed; ...`` as the verdict, and the
failure line (with the command that resumes it, where a checkpoint was
complete) as the last line.

Exit status: 0 when the report was printed and the ledger balanced; 1 when the
run failed (a partial report) or the ledger did not balance, or the PNG or the event files could not be written
(matplotlib or tensorboard missing, the file not writable); 2 when the run directory, ``report.json`` or
``ledger.json`` is missing or malformed (one line on stderr naming the file), or with ``--timeline`` when
``trace.json`` is malformed or ``--window`` lies outside the trace (one line naming its time span in ms).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gflowdist.errors import GflowdistError

if TYPE_CHECKING:
    from gflowdist.timing import Report

__all__ = ["add_parser", "run", "load_run", "ledger_verdict", "final_line", "RunRecord"]

REPORT_FILE = "report.json"
LEDGER_FILE = "ledger.json"
#: Totals ``ledger.json`` must hold when it says ``"balanced": true``.
LEDGER_TOTALS = ("produced", "used_locally", "received", "admitted", "dropped", "in_flight")


class RunDirError(GflowdistError):
    """The run directory, or one of its files, is missing or malformed (exit status 2)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gflowdist report``."""
    parser = subparsers.add_parser(
        "report",
        help="print a finished run's report (load imbalance, waits, staleness, ledger)",
        description="Print the end-of-run report of RUN_DIR (from its report.json), the ledger "
        "verdict (ledger.json) and the run's final line.",
    )
    parser.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        nargs="?",
        default=None,
        help="a run directory, e.g. runs/hypergrid-20260101-120000, or a folder of runs (its newest run); "
        "default: the newest run in runs/",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object {run_dir, report, ledger, final_line} instead of text",
    )
    parser.add_argument(
        "--png",
        metavar="PATH",
        default=None,
        help="also draw the report's figure into PATH (report.png of the run is the same figure)",
    )
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write TensorBoard event files of every metric and timing phase into "
        "RUN_DIR/tensorboard (needs the tensorboard package)",
    )
    parser.add_argument(
        "--timeline",
        metavar="PNG",
        default=None,
        help="also draw a stretch of RUN_DIR/trace.json (every run writes one; run.trace is on by default) into PNG",
    )
    parser.add_argument(
        "--window",
        metavar="START_MS:END_MS",
        default=None,
        type=_window,
        help="the stretch --timeline draws, in milliseconds of the trace (default: 150 ms from the middle of the run)",
    )
    parser.set_defaults(handler=run)


def _window(text: str) -> tuple[float, float]:
    """argparse type of ``--window``: ``START_MS:END_MS`` with START < END."""
    start, _, end = text.partition(":")
    try:
        window = float(start), float(end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START_MS:END_MS, e.g. 200:350, found {text!r}") from None
    if window[0] >= window[1]:
        raise argparse.ArgumentTypeError(f"expected START_MS < END_MS, found {text!r}")
    return window


@dataclass(frozen=True)
class RunRecord:
    """What ``gflowdist report`` reads from a run directory.

    Attributes:
        run_dir: the directory given.
        report: the :class:`~gflowdist.timing.Report` rebuilt from ``report.json``.
        ledger: ``ledger.json`` as the runtime wrote it (its shape checked).
    """

    run_dir: Path
    report: Report
    ledger: dict[str, Any]


def _read_json(path: Path) -> Any:
    if not path.is_file():
        hint = "" if path.parent.is_dir() else f" ({path.parent} does not exist)"
        raise RunDirError(
            f"{path}: not found{hint}; a run writes it when it ends, also when it fails (a run still going, or "
            f"one whose collector was lost, has only logs/ and metrics.jsonl)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise RunDirError(f"{path}: cannot be read: {err}") from err
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}: not valid JSON: {err}") from err


def _check_ledger(data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("balanced"), bool):
        raise RunDirError(f"{path}: malformed: expected an object with a boolean 'balanced'")
    if data["balanced"]:
        totals = data.get("totals")
        bad = [
            k
            for k in LEDGER_TOTALS
            if not isinstance(totals, dict) or not isinstance(totals.get(k), int) or isinstance(totals.get(k), bool)
        ]
        if bad:
            raise RunDirError(f"{path}: malformed: 'totals' lacks integer {', '.join(bad)}")
    elif not isinstance(data.get("error"), str):
        raise RunDirError(f"{path}: malformed: an unbalanced ledger must carry its 'error' message")
    if "final_line" in data and not isinstance(data["final_line"], str):
        raise RunDirError(f"{path}: malformed: 'final_line' must be a string")
    return data


def load_run(run_dir: str | Path) -> RunRecord:
    """Read and check ``report.json`` and ``ledger.json``; raises :class:`RunDirError`."""
    from gflowdist.timing import Report

    directory = Path(run_dir)
    if not directory.is_dir():
        raise RunDirError(f"{directory}: not a directory (give the run directory that `gflowdist run` printed)")
    report_path = directory / REPORT_FILE
    report_data = _read_json(report_path)
    if not isinstance(report_data, dict):
        raise RunDirError(f"{report_path}: malformed: expected a JSON object, found {type(report_data).__name__}")
    try:
        report = Report.from_dict(report_data)
    except GflowdistError as err:
        raise RunDirError(f"{report_path}: {err}") from err
    ledger_path = directory / LEDGER_FILE
    ledger = _check_ledger(_read_json(ledger_path), ledger_path)
    return RunRecord(directory, report, ledger)


def ledger_verdict(ledger: dict[str, Any]) -> str:
    """The one-line verdict of a checked ``ledger.json``.

    Balanced means, summed over ranks (:func:`gflowdist.runtime.ledger.check_ledgers`):
    ``produced = used_locally + received + in_flight`` and
    ``received = admitted + dropped``.
    """
    if ledger.get("partial"):
        return "ledger: not checked -- the run failed; this report holds what its ranks held when it ended"
    if not ledger["balanced"]:
        return f"ledger: NOT balanced -- {ledger['error']}"
    t = ledger["totals"]
    return (
        f"ledger: balanced -- {t['produced']} produced = {t['used_locally']} used locally + "
        f"{t['received']} received + {t['in_flight']} in flight; {t['admitted']} admitted, "
        f"{t['dropped']} dropped"
    )


def final_line(record: RunRecord) -> str:
    """The run's last line: stored by the runtime, else rebuilt from ``ledger.json``."""
    ledger = record.ledger
    if "final_line" in ledger:
        return ledger["final_line"]
    if not ledger["balanced"]:
        return f"gflowdist: failed: {ledger['error']}; run directory {record.run_dir}"
    t = ledger["totals"]
    return (
        f"gflowdist: done: {t['produced']} trajectories produced, {t['admitted']} admitted, "
        f"{t['dropped']} dropped, ledger balanced; run directory {record.run_dir}"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(args: argparse.Namespace) -> int:
    """Print the report; see the module docstring for the exit statuses."""
    from gflowdist.cli import EXIT_FAILURE, EXIT_USAGE
    from gflowdist.cli.run_pick import pick_run

    try:
        args.run_dir, choice = pick_run(args.run_dir)
    except GflowdistError as err:
        print(f"gflowdist report: error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    if choice is not None:
        print(f"gflowdist report: {choice}", file=sys.stderr)
    try:
        record = load_run(args.run_dir)
    except RunDirError as err:
        print(f"gflowdist report: error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    missing = _missing_tool(args)
    if missing:
        print(f"gflowdist report: {missing}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        trace = _timeline_trace(args, record)
    except RunDirError as err:
        print(f"gflowdist report: error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    verdict, last = ledger_verdict(record.ledger), final_line(record)
    if args.json:
        print(
            json.dumps(
                {
                    "run_dir": str(record.run_dir),
                    "report": record.report.to_dict(),
                    "ledger": record.ledger,
                    "final_line": last,
                },
                indent=1,
                allow_nan=False,
            )
        )
    else:
        print(record.report.to_text())
        print()
        print(verdict)
        print(last)
    try:
        _write_extras(args, record, trace)
    except (OSError, GflowdistError) as err:
        print(f"gflowdist report: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_FAILURE
    return 0 if record.ledger["balanced"] else EXIT_FAILURE


def _missing_tool(args: argparse.Namespace) -> str | None:
    """Why ``--png``, ``--timeline`` or ``--tensorboard`` cannot be done (checked before anything is printed)."""
    if args.timeline is not None and not (Path(args.run_dir) / "trace.json").is_file():
        return (
            f"--timeline: {Path(args.run_dir) / 'trace.json'} not found: the run had run.trace=false "
            f"(tracing is on by default) or did not reach its end"
        )
    if args.png is not None or args.timeline is not None:
        from gflowdist.timing.figure import figure_unavailable_reason

        if figure_unavailable_reason() is not None:
            option = "--png" if args.png is not None else "--timeline"
            return (
                f"{option} needs matplotlib, a dependency of gflowdist, which does not import: "
                "pip install 'matplotlib>=3.6'"
            )
    if args.tensorboard:
        from gflowdist.timing.tensorboard import tensorboard_unavailable_reason

        reason = tensorboard_unavailable_reason()
        if reason is not None:
            return f"--tensorboard: {reason}"
    return None


def _timeline_trace(args: argparse.Namespace, record: RunRecord) -> dict[str, Any] | None:
    """With ``--timeline``: ``trace.json``, checked (its shape; ``--window`` within its time span), before anything
    is printed; raises :class:`RunDirError` (exit 2) naming the file or the trace's span."""
    return None if args.timeline is None else _read_timeline_trace(record, args.window)


def _read_timeline_trace(record: RunRecord, window: tuple[float, float] | None) -> dict[str, Any]:
    """The run's ``trace.json``, checked (its shape; ``window`` within its time span, when given)."""
    from gflowdist.timing.trace_figure import WindowError, check_window

    path = record.run_dir / "trace.json"
    trace = _read_json(path)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise RunDirError(f"{path}: malformed: expected a JSON object with a 'traceEvents' list")
    if window is not None:
        try:
            check_window(trace, window)
        except WindowError as err:
            raise RunDirError(f"--window: {path}: {err}") from None
    return trace


def _write_extras(args: argparse.Namespace, record: RunRecord, trace: dict[str, Any] | None = None) -> None:
    """The figure (``--png``), the timeline (``--timeline``, of ``trace``) and the event files (``--tensorboard``),
    each announced on stderr."""
    if args.png is not None:
        from gflowdist.timing.figure import save_figure

        try:
            written = save_figure(record.report, args.png)
        except OSError as err:
            raise OSError(f"cannot write {args.png}: {err}") from None
        print(f"gflowdist report: figure written to {written}", file=sys.stderr)
    if args.timeline is not None:
        from gflowdist.timing.trace_figure import draw_timeline

        if trace is None:
            trace = _read_timeline_trace(record, args.window)
        try:
            written = draw_timeline(trace, args.timeline, window_ms=args.window)
        except OSError as err:
            raise OSError(f"cannot write {args.timeline}: {err}") from None
        print(f"gflowdist report: timeline written to {written}", file=sys.stderr)
    if args.tensorboard:
        from gflowdist.timing.tensorboard import write_tensorboard

        try:
            folder = write_tensorboard(record.run_dir)
        except (OSError, GflowdistError) as err:
            raise GflowdistError(f"--tensorboard: {err}") from None
        print(f"gflowdist report: TensorBoard event files in {folder} (tensorboard --logdir {folder})", file=sys.stderr)
