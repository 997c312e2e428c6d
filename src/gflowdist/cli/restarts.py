"""Restarting a failed job: ``faults.max_restarts`` (``gflowdist run --max-restarts N``).

When a launched job fails for a reason a restart can cure (a lost rank, a
cut link, a rank killed by a signal, an exception seen for the first time at
that step), ``gflowdist run`` waits ``faults.restart_delay_s``, starts the
same layout again with ``--resume RUN_DIR`` and so continues from the newest
complete, intact checkpoint, up to ``faults.max_restarts`` times. Each
attempt is a generation in the same run directory; ``restarts.json`` there
lists every restart with why the attempt before it ended, which the new
generation's collector shows on its progress line and in its report.

Not retried: the user's own Ctrl-C or SIGTERM to ``gflowdist run``; a
config or layout error (it would fail the same way); a ledger that does not
balance (a bug, not a fault); the same exception at the same step as the
attempt before (retrying cannot help); a run directory without a complete
checkpoint to resume from. Each refusal is one line saying why.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from gflowdist.errors import CheckpointError, ConfigError
from gflowdist.rundir import newest_intact, recorded_config

__all__ = ["Ended", "keep_going", "why_not_restart", "RESTARTS_FILE"]

#: In the run directory: one entry per restart, appended by the launcher before it relaunches.
RESTARTS_FILE = "restarts.json"

_FAILED = re.compile(r"^gflowdist: rank \d+ \([^)]*\) failed(?: at step (\d+))?: (\w+)(.*)$")
_NOT_CURABLE = {
    "ConfigError": "a config error",
    "LayoutError": "a layout error",
    "LedgerError": "a ledger that does not balance (a bug, not a fault)",
}


@dataclass
class Ended:
    """How one attempt ended: the launcher's exit status, the failure it believed, whether the user stopped it."""

    code: int
    failure: str | None = None
    interrupted: bool = False
    overran: bool = False  # stopped by a signal, but not within faults.preempt_grace_s: killed
    #: what the launcher saw end when no rank reported a failure (a helper killed: :func:`unexplained`)
    seen: str | None = None

    @property
    def reason(self) -> str:
        """One line: the failure's first line without the ``gflowdist:`` prefix, else the exit status."""
        if self.failure:
            return self.failure.splitlines()[0].removeprefix("gflowdist:").strip()
        return f"exit status {self.code}"

    def judged_by(self, run_dir: Path, *, since: float) -> Ended:
        """A non-zero exit that only a rank lost and gone on without explains is a success.

        ``faults.on_actor_loss: continue`` (or ``replace``): the run finished and its ledger
        balanced (``ledger.json``, written after ``since``, names the lost
        or replaced ranks), no rank reported a failure, and the launcher's status is the
        lost rank's (137 for kill -9). Stopped by SIGINT/SIGTERM, such a run ends
        with the signal's status (130, 143), as one without a lost rank does.
        """
        if self.code == 0 or self.failure or self.overran or self.code in (130, 143):
            return self
        path = Path(run_dir) / "ledger.json"
        try:
            ledger = json.loads(path.read_text()) if path.stat().st_mtime >= since else {}
        except (OSError, ValueError):
            return self
        if not (ledger.get("balanced") and (ledger.get("lost_ranks") or ledger.get("replaced_ranks"))):
            return self
        if self.interrupted:  # the stop's own status; the run says which signal stopped it
            stopped_by = re.search(r"\(signal (SIGINT|SIGTERM)\)", str(ledger.get("final_line", "")))
            if stopped_by is None:
                return self
            return Ended(130 if stopped_by[1] == "SIGINT" else 143, interrupted=True)
        if not ledger.get("lost_ranks"):  # every lost actor was replaced (faults.on_actor_loss: replace)
            replaced = ", ".join(f"rank {rank}" for rank in ledger["replaced_ranks"])
            sys.stderr.write(
                f"gflowdist: finished with {replaced} replaced (faults.on_actor_loss = replace); exit status 0, "
                f"not {self.code}: that came from the lost process\n"
            )
            return Ended(0)
        lost = ", ".join(f"rank {rank}" for rank in ledger["lost_ranks"])
        sys.stderr.write(
            f"gflowdist: finished without {lost} (faults.on_actor_loss = continue); exit status 0, "
            f"not {self.code}: that came from the lost rank and from ranks that could not finalize MPI "
            f"with it gone\n"
        )
        return Ended(0)

    def signature(self) -> tuple[str | None, str] | None:
        """``(step, "Type: message")`` of a rank's exception; None for anything else (a lost rank)."""
        match = _FAILED.match(self.failure.splitlines()[0]) if self.failure else None
        return None if match is None else (match[1], match[2] + match[3])


def why_not_restart(ended: Ended, previous: Ended | None, run_dir: Path) -> str | None:
    """Why ``ended`` must not be restarted (one line), or None when a restart may cure it."""
    if ended.interrupted:
        return "the job was stopped from outside (SIGINT/SIGTERM to gflowdist run)"
    signature = ended.signature()
    if signature is not None and signature[1].split(":")[0] in _NOT_CURABLE:
        return f"{_NOT_CURABLE[signature[1].split(':')[0]]} fails the same way again: {ended.reason}"
    if signature is not None and previous is not None and previous.signature() == signature:
        where = f"at step {signature[0]} " if signature[0] is not None else ""
        return f"the same exception {where}ended the attempt before too: {signature[1]}"
    if not any((Path(run_dir) / "checkpoints").glob("*/MANIFEST.json")):
        return (
            f"no complete checkpoint in {Path(run_dir) / 'checkpoints'} to resume from "
            f"(faults.checkpoint_every = 0 writes one only at the end)"
        )
    try:  # the checks a resume makes before it launches (manifests, sizes, SHA-256; no torch)
        newest_intact(run_dir, recorded_config(run_dir).launch.nprocs)
    except (CheckpointError, ConfigError) as err:
        return f"no intact checkpoint to resume from: {err}"
    return None


def keep_going(
    ended: Ended,
    *,
    max_restarts: int,
    delay_s: float,
    run_dir: Path,
    relaunch: Callable[[dict], Ended],
    out: TextIO | None = None,
) -> int:
    """Relaunch after curable failures, up to ``max_restarts`` times; returns the last attempt's exit status.

    ``relaunch(record)`` starts the job again with ``--resume``; ``record`` is the restart's entry of
    ``restarts.json``, for the new job's ranks (``GFLOWDIST_RESTART``).
    """
    out = out if out is not None else sys.stderr
    previous = None
    for restart in range(1, max_restarts + 1):
        if ended.code == 0:
            return 0
        refusal = why_not_restart(ended, previous, run_dir)
        if refusal is not None:
            _say(out, f"not restarting: {refusal}")
            return ended.code
        record = _record(run_dir, restart, max_restarts, ended)
        _say(
            out,
            f"restart {restart} of {max_restarts} in {delay_s:g} s, from the newest intact checkpoint of "
            f"{run_dir}; the attempt before ended: {ended.reason}",
        )
        time.sleep(delay_s)
        previous, ended = ended, relaunch(record)
    if ended.code != 0 and max_restarts and not ended.interrupted:
        _say(out, f"not restarting: no restart left (faults.max_restarts = {max_restarts})")
    return ended.code


def _say(out: TextIO, line: str) -> None:
    out.write(f"gflowdist: {line}\n")
    out.flush()


def _record(run_dir: Path, restart: int, max_restarts: int, ended: Ended) -> dict:
    """Append this restart to ``restarts.json``; returns its entry."""
    path = Path(run_dir) / RESTARTS_FILE
    try:
        entries = json.loads(path.read_text()) if path.exists() else []
    except (OSError, ValueError):
        entries = []
    entry = {
        "restart": restart,
        "of": max_restarts,
        "previous_ended": ended.reason,
        "exit_status": ended.code,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    entries.append(entry)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(entries, indent=1))
    tmp.replace(path)
    return entry
