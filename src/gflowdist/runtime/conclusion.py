"""What the collector writes once every rank's final report is in: the run's end, in its run directory.

    checkpoints/<final>/MANIFEST.json   the final checkpoint, now complete
    finals.json                         every rank's final report
    report.txt, report.json, report.png the load-imbalance report (timing.build_report)
    [trace.json]                        every rank's timeline (run.trace; timing.trace_file)
    [tensorboard/]                      event files of the metrics and timings (run.tensorboard)
    ledger.json                         the ledger check: balanced, totals, per rank, the final line
    generations.json                    this generation's entry appended (runtime.history)

An earlier generation's report and trace are kept under ``report.gen<G>.*`` first
(:func:`gflowdist.runtime.history.keep_earlier`). Then the console gets the
headline figures (:func:`gflowdist.timing.headline.headline`: one screen, the
whole report stays in report.txt) and the final line; a run stopped by a signal
ends with the command that resumes it. A ledger that does not balance raises
:class:`~gflowdist.errors.LedgerError` after ledger.json says why.

A run that failed ends in :func:`conclude_failed` instead (its post-mortem,
:mod:`gflowdist.runtime.postmortem`), from what the ranks held::

    failure.json                        the failure(s) at the top, each rank's part (answered, lost, silent)
    report.txt, report.json, report.png the report of what was gathered, marked partial, the failure first
    [trace.json]                        the timelines gathered, up to the failure (otherData.partial)
    ledger.json                         not checked ("partial": true, "balanced": false), the failure line
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gflowdist.errors import GflowdistError, LedgerError
from gflowdist.runtime import checkpoints
from gflowdist.runtime.failures import Failure
from gflowdist.runtime.history import GenerationFacts, keep_earlier, record_generation
from gflowdist.runtime.ledger import Ledger, check_ledgers
from gflowdist.timing.curves import chosen_curves, curve_order, curves_by_step

if TYPE_CHECKING:
    from gflowdist.timing.report import Report

__all__ = ["JobResult", "conclude", "conclude_failed", "failure_lines", "curves_by_step"]

log = logging.getLogger("gflowdist.runtime")


class JobResult(dict[str, Any]):
    """What the collector returns: run_dir, totals of the ledger, last metrics, final checkpoint, summaries."""


def conclude(
    run_dir: Path,
    final_name: str,
    finals: dict[int, dict[str, Any]],
    *,
    world_size: int,
    generation: int,
    last_metrics: Mapping[int, dict[str, Any]],
    stop_reason: str,
    tensorboard: bool,
    out: TextIO,
    notes: Sequence[str] = (),
    facts: GenerationFacts | None = None,
) -> JobResult:
    """Write the run's end (see the module docstring) from every rank's final report; returns the result.

    ``notes``: lines for the report's notes (the generation and why the one before ended); ranks lost and
    gone on without (their finals carry ``lost``) are noted too, and named in ledger.json and the final line.
    ``facts``: what the collector knows of this generation (its rate, unit, warnings, the curves to draw).
    """
    facts = facts if facts is not None else GenerationFacts(generation=generation)
    lost = {r: f["lost"] for r, f in sorted(finals.items()) if f.get("lost")}
    # actors lost and replaced (faults.on_actor_loss: replace): why each incarnation before the last was lost
    replaced = {r: [e["reason"] for e in f["replaced"]] for r, f in sorted(finals.items()) if f.get("replaced")}
    checkpoints.write_manifest(
        run_dir,
        final_name,
        {
            "world_size": world_size,
            "generation": generation,
            "complete": True,
            "steps": {str(r): f.get("step", 0) for r, f in finals.items()},
            **({"lost": {str(r): why for r, why in lost.items()}} if lost else {}),
            **({"replaced": _earlier_ledgers(finals)} if replaced else {}),
        },
        files={r: f["checkpoint_file"] for r, f in finals.items()},
    )
    keep_earlier(run_dir)  # an earlier generation's report and trace, under report.gen<G>.*
    traces = {r: f.pop("trace") for r, f in finals.items() if "trace" in f}
    if traces:
        _write_trace(run_dir, traces, finals)
    (run_dir / "finals.json").write_text(json.dumps({str(r): finals[r] for r in sorted(finals)}, indent=1))
    ledgers = {r: Ledger.from_dict(f["ledger"]) for r, f in finals.items()}
    notes = [*notes, *facts.warnings, *(f"went on without rank {r}: {why}" for r, why in lost.items())]
    notes += [f"replaced rank {r} (lost: {why})" for r, whys in replaced.items() for why in whys]
    made = sum(item.produced for item in ledgers.values()) - facts.produced_before
    history = record_generation(
        run_dir,
        {
            "generation": generation,
            "steps": [facts.from_step, max((f.get("step", 0) for f in finals.values()), default=0)],
            "seconds": None if facts.seconds is None else round(facts.seconds, 3),
            "made": made,
            "unit": facts.unit,
            "ended": stop_reason or "done",
            "report": "report.txt",
        },
    )
    report = _report(run_dir, finals, ledgers, notes, facts, history)
    if tensorboard:
        _write_tensorboard(run_dir, out)
    totals = _check_ledgers(run_dir, ledgers, stop_reason, lost, facts.unit, replaced)
    _say_end(out, report, run_dir, totals["final_line"], facts, made, stop_reason)
    return JobResult(
        run_dir=str(run_dir),
        totals=totals["totals"],
        last_metrics=dict(last_metrics),
        checkpoint=final_name,
        summaries={r: f.get("summary", {}) for r, f in finals.items()},
    )


def _say_end(
    out: TextIO, report: Report, run_dir: Path, final_line: str, facts: GenerationFacts, made: int, stop: str
) -> None:
    """One screen: the headline figures, the final line, and after a signal the command that resumes."""
    from gflowdist.cli.report_cmd import ledger_verdict
    from gflowdist.timing.headline import headline

    verdict = ledger_verdict(json.loads((run_dir / "ledger.json").read_text()))
    lines = headline(
        report,
        verdict=verdict,
        run_dir=run_dir,
        seconds=facts.seconds,
        made=made,
        unit=facts.unit,
        warnings=facts.warnings,
    )
    for line in lines:
        out.write(f"gflowdist: {line}\n")
    out.write(final_line + "\n")
    if stop.startswith("signal"):
        out.write(
            f"gflowdist: stopped by {stop.removeprefix('signal ')}; resume with: gflowdist run --resume {run_dir}\n"
        )
    out.flush()


def conclude_failed(
    run_dir: Path,
    failures: Sequence[Failure],
    states: dict[int, dict[str, Any]],
    *,
    world_size: int,
    generation: int,
    missing: Mapping[int, str],
    resume: str | None,
    notes: Sequence[str] = (),
    figure: bool = True,
) -> str:
    """A failed run's post-mortem in ``run_dir`` (see the module docstring) from what each rank held (``states``:
    rank -> its partial final report, or what the collector last heard of it); returns the failure line.
    ``figure``: draw report.png (``report.figure``)."""
    failure = failures[0]
    line = f"{failure.headline}; partial report in {run_dir / 'report.txt'}" + (f"; resume: {resume}" if resume else "")
    parts = {
        str(r): {
            "role": f.get("role"),
            "host": f.get("host"),
            "step": f.get("step"),
            "part": "lost" if f.get("lost") else "silent" if f.get("silent") else "held",
            **({"lost": f["lost"]} if f.get("lost") else {}),
            **({"why": missing[r]} if r in missing else {}),
            **({"last_metrics": f["last_metrics"]} if f.get("last_metrics") else {}),
        }
        for r, f in sorted(states.items())
    }
    (run_dir / "failure.json").write_text(
        json.dumps(
            {
                "partial": True,
                "generation": generation,
                "world_size": world_size,
                "failure_line": line,
                "resume": resume,
                "failures": [f.to_dict() for f in failures],
                "ranks": parts,
            },
            indent=1,
            default=str,
        )
    )
    keep_earlier(run_dir)  # an earlier generation's report and trace, under report.gen<G>.*
    traces = {r: f.pop("trace") for r, f in states.items() if "trace" in f}
    if traces:
        _write_trace(run_dir, traces, states, partial=failure.headline)
    ledgers = {r: Ledger.from_dict(f.get("ledger") or {}) for r, f in states.items()}
    lost = {r: f["lost"] for r, f in states.items() if f.get("lost")}
    notes = [
        *notes,
        *(f"rank {r} was lost: {why}" for r, why in sorted(lost.items())),
        *(f"rank {r} sent nothing for the post-mortem ({why}): its last metrics only" for r, why in missing.items()),
    ]
    _report(
        run_dir,
        states,
        ledgers,
        notes,
        GenerationFacts(generation=generation, figure=figure),
        failure=failure_lines(failures, resume),
    )
    (run_dir / "ledger.json").write_text(
        json.dumps(
            {
                "balanced": False,
                "partial": True,
                "error": f"not checked: the run failed ({failure.headline.removeprefix('gflowdist: ')})",
                "final_line": f"gflowdist: FAILED: {line.removeprefix('gflowdist: ')}",
                "per_rank": {str(r): item.to_dict() for r, item in ledgers.items()},
            },
            indent=1,
        )
    )
    log.info("post-mortem written: %s", line)
    return line


def failure_lines(failures: Sequence[Failure], resume: str | None) -> tuple[str, ...]:
    """The top of a partial report: the failure, where in the user's code, the others, the resume command."""
    first, *others = failures
    lines = [f"failure: {first.headline.removeprefix('gflowdist: ')}"]
    if first.frame:
        lines.append(f"  in your code: {first.frame}")
    log_line = next((line for line in first.text.splitlines() if "the whole traceback:" in line), None)
    if log_line:
        lines.append(log_line)
    lines += [f"also: {f.headline.removeprefix('gflowdist: ')}" for f in others]
    lines.append(f"resume: {resume}" if resume else "resume: no complete checkpoint (faults.checkpoint_every)")
    return tuple(lines)


def _report(
    run_dir: Path,
    finals: dict[int, dict[str, Any]],
    ledgers: dict[int, Ledger],
    notes: Sequence[str],
    facts: GenerationFacts | None = None,
    history: Sequence[dict[str, Any]] = (),
    *,
    failure: Sequence[str] = (),
) -> Report:
    """The load-imbalance report of the run, saved in ``run_dir``."""
    from gflowdist.timing import build_report

    metrics_path = run_dir / "metrics.jsonl"
    rows = []
    if metrics_path.exists():
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    roles = {r: str(f["role"]) for r, f in finals.items()}
    report = build_report(
        {r: f["timing"] for r, f in finals.items() if f.get("timing") is not None},  # a lost rank sent none
        roles={r: f["role"] for r, f in finals.items()},
        hosts={r: f["host"] for r, f in finals.items()},
        ledger={
            r: {
                "produced": item.produced,
                "sent": item.sent,
                "used_locally": item.used_locally,
                "received": item.received,
                "admitted": item.admitted,
                "dropped": dict(item.dropped),
                "in_flight": item.in_flight,
                "expired": item.expired,
            }
            for r, item in ledgers.items()
        },
        staleness={r: f["staleness"] for r, f in finals.items() if f.get("staleness")},
        metrics=curves_by_step(rows, roles),
    )
    order = curve_order(rows, roles)
    shown, unknown = chosen_curves(order, facts.curves if facts is not None else ())
    if unknown:
        notes = [
            *notes,
            f"report.curves names {', '.join(map(repr, unknown))}, which no rank reported; "
            f"the metrics are: {', '.join(order) or 'none'}",
        ]
    report = dataclasses.replace(
        report,
        curves={k: report.curves[k] for k in sorted(report.curves, key=_position(order))},
        metrics=tuple(sorted(report.metrics, key=lambda m: _position(order)(m.name))),
        shown_curves=tuple(shown),
    )
    if notes or failure:
        report = dataclasses.replace(report, notes=(*notes, *report.notes), failure=tuple(failure))
    served = {r: f["inference"] for r, f in finals.items() if isinstance(f.get("inference"), dict)}
    if served:
        report = dataclasses.replace(report, inference=served)
    if facts is not None:
        report = dataclasses.replace(
            report,
            generation=facts.generation,
            generations=tuple(history),
            unit=facts.unit,
        )
    report.save(run_dir, figure=facts.figure if facts is not None else True)
    return report


def _write_trace(
    run_dir: Path, traces: dict[int, dict[str, Any]], finals: dict[int, dict[str, Any]], partial: str | None = None
) -> None:
    """trace.json: every rank's timeline on the collector's clock, collectives with their last arrivers;
    ``partial``: the failure that ended the run (``otherData.partial``, ``otherData.failure``)."""
    from gflowdist.timing.trace_file import chrome_trace, write_trace

    trace = chrome_trace(
        traces,
        names={r: f"rank {r} {f['role']} @{f['host']}" for r, f in finals.items()},
        offsets={r: float(f.get("clock_offset", 0.0)) for r, f in finals.items()},
        timings={r: f["timing"] for r, f in finals.items() if f.get("timing") is not None},
    )
    if partial is not None:
        trace["otherData"].update(partial=True, failure=partial)
    write_trace(run_dir / "trace.json", trace)


def _write_tensorboard(run_dir: Path, out: TextIO) -> None:
    """``run.tensorboard``: event files from what the run directory now holds (metrics.jsonl is the source)."""
    from gflowdist.timing.tensorboard import write_tensorboard

    try:
        folder = write_tensorboard(run_dir)
    except (ImportError, OSError, GflowdistError) as err:  # the run itself is done: say so, keep its result
        log.warning("TensorBoard files not written: %s", err)
        out.write(f"gflowdist: TensorBoard files not written: {err}\n")
        return
    out.write(f"gflowdist: TensorBoard event files in {folder} (tensorboard --logdir {folder})\n")


def _check_ledgers(
    run_dir: Path,
    ledgers: dict[int, Ledger],
    stop_reason: str,
    lost: Mapping[int, str],
    unit: str = "trajectories",
    replaced: Mapping[int, list[str]] | None = None,
) -> dict[str, Any]:
    """Check the job's ledger and write ledger.json; returns ``{"totals", "final_line"}`` or raises.

    ``replaced``: the ranks whose actor was lost and replaced, with why (ledger.json's ``replaced_ranks``)."""
    replaced = replaced or {}
    per_rank = {str(r): item.to_dict() for r, item in ledgers.items()}
    lost_ranks = {str(r): why for r, why in lost.items()}
    try:
        totals = check_ledgers(ledgers)
    except LedgerError as err:
        line = f"gflowdist: FAILED: {err}; run directory {run_dir}"
        (run_dir / "ledger.json").write_text(
            json.dumps({"balanced": False, "error": str(err), "final_line": line, "per_rank": per_rank}, indent=1)
        )
        raise
    malformed = totals["malformed_messages"]
    line = (
        f"gflowdist: done{' (' + stop_reason + ')' if stop_reason else ''}: "
        f"{totals['produced']} {unit} produced, {totals['admitted']} admitted, "
        f"{totals['dropped']} dropped{_expired(totals)}, ledger balanced"
        f"{f'; {malformed} malformed messages rejected' if malformed else ''}"
        f"{_refused(ledgers)}"
        f"{f'; went on without rank {_ranks(lost)}' if lost else ''}"
        f"{f'; replaced rank {_ranks(replaced)}' if replaced else ''}; run directory {run_dir}"
    )
    (run_dir / "ledger.json").write_text(
        json.dumps(
            {
                "balanced": True,
                "totals": totals,
                "final_line": line,
                "lost_ranks": lost_ranks,
                **({"replaced_ranks": {str(r): whys for r, whys in replaced.items()}} if replaced else {}),
                "per_rank": per_rank,
            },
            indent=1,
        )
    )
    return {"totals": totals, "final_line": line}


def _expired(totals: Mapping[str, int]) -> str:
    """`` (4 of them stale after admission)``: the queue's drops of admitted items; "" if none."""
    return f" ({totals['expired']} of them stale after admission)" if totals.get("expired") else ""


def _refused(ledgers: Mapping[int, Ledger]) -> str:
    """``; 15 batches refused (from rank 1: 15)``: batches buffers could not store, by sender; "" if none."""
    senders: dict[int, int] = {}
    for ledger in ledgers.values():
        for sender, n in ledger.refused.items():
            senders[sender] = senders.get(sender, 0) + n
    if not senders:
        return ""
    by = ", ".join(f"rank {r}: {n}" for r, n in sorted(senders.items()))
    return f"; {sum(senders.values())} batches refused (from {by})"


def _earlier_ledgers(finals: Mapping[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The summed ledgers of each replaced rank's lost processes (a resumed rank adds them to its own)."""
    summed = {}
    for rank, final in finals.items():
        if final.get("replaced"):
            total = Ledger()
            for entry in final["replaced"]:
                lost = Ledger.from_dict(entry["ledger"])
                total.produced += lost.produced
                total.sent += lost.sent
                total.dropped.update(lost.dropped)
            summed[str(rank)] = total.to_dict()
    return summed


def _ranks(lost: Mapping[int, Any]) -> str:
    return ", ".join(str(r) for r in sorted(lost))


def _position(order: Sequence[str]) -> Callable[[str], int]:
    """Sort key: a curve's place in ``order`` (the others after, as they were)."""
    index = {name: i for i, name in enumerate(order)}
    return lambda name: index.get(name, len(index))
