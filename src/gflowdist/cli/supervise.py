"""Supervising a launched job: the failure file, signals, orphans, the end of every process (``gflowdist run``).

:func:`supervise` waits for the processes ``gflowdist run`` started (mpiexec,
or the gloo ranks), forwards the first SIGINT/SIGTERM to them, forces an exit
on the third, gives a stop ``faults.preempt_grace_s`` to write its final
checkpoint (and :data:`AFTER_CHECKPOINT_S` more for its report once that is
intact), a failing job the
time to name its failure, and leaves no process of the job behind. The
failure file (``$GFLOWDIST_FAILURE_FILE``) is where a failing rank writes its
message for the launcher to print.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gflowdist.cli.hydra_files import TopologyFiles
from gflowdist.cli.restarts import Ended
from gflowdist.cli.stderr_relay import StderrRelay, choose_failure
from gflowdist.process_tree import DescendantTracker, kill_group

__all__ = [
    "supervise",
    "failure_file",
    "FAILURE_FILE_NAME",
    "final_saved",
    "say",
    "FORCE_AFTER_SIGNALS",
    "SIGNAL_BURST_S",
]

_FAILURE_FILES: list[str] = []


#: Once a rank reported a failure, the job's collector may take this long to write its post-mortem (it waits
#: at most min(peer_timeout_s, 10 s) for the ranks' parts, then writes report.png and trace.json).
POSTMORTEM_GRACE_S = 60.0


#: The failure file's name in the run directory: written (appended) by a failing rank only, read and removed by
#: the launcher at the end of each launch; a run that does not fail never has one.
FAILURE_FILE_NAME = ".failures.txt"


def failure_file(run_dir: str | os.PathLike[str]) -> str:
    """Where this launch's ranks write their failure messages (``$GFLOWDIST_FAILURE_FILE``): a file in the run
    directory, made by the first rank that fails (nothing is left in ``/tmp``, also when the launcher is killed)."""
    path = os.path.join(run_dir, FAILURE_FILE_NAME)
    if path not in _FAILURE_FILES:
        _FAILURE_FILES.append(path)
    return path


def _failure_messages() -> list[str]:
    """The complete entries of the failure file so far (each ends with a NUL), in the order written."""
    messages = []
    for path in _FAILURE_FILES:
        try:
            with open(path) as f:
                entries = f.read().split("\0")[:-1]  # the last piece is unfinished or empty
        except FileNotFoundError:
            continue
        messages += [m.strip() for m in entries if m.strip()]
    return messages


def _without_consequences(message: str, others: list[str]) -> list[str]:
    """``others`` less a rank's silence after it failed: "lost rank R" where rank R's failure is already told."""
    failed = set(re.findall(r"\brank (\d+) \([^)]*\) failed", "\n".join([message, *others])))
    return [line for line in others if not ((lost := re.match(r"lost rank (\d+) ", line)) and lost[1] in failed)]


def _report_failure(code: int, relay: StderrRelay | None = None) -> str | None:
    """Print the rank failure to believe (MPI's abort may have eaten the rank's own stderr).

    With a stderr relay, that is the first entry whose first line came through
    mpiexec (a rank on the launcher's side of any partition); else the first.
    """
    messages = _failure_messages()
    message = choose_failure(messages, relay)
    others = [
        m.splitlines()[0].removeprefix("gflowdist: ")
        for m in messages
        if m != message
        and m.splitlines()[0] != (message or "").splitlines()[0]
        and (relay is None or relay.seen(m.splitlines()[0]))
    ]
    others = _without_consequences(message or "", others)
    if message and others:  # the same failure on several ranks (every trainer's loss): the first in full
        message += "".join(f"\n  also: {line}" for line in dict.fromkeys(others[:3]))
    for path in _FAILURE_FILES:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _FAILURE_FILES.clear()
    if code != 0 and message:
        end_progress_line()
        sys.stderr.write(f"gflowdist: the job failed (exit {code}):\n{message}\n")
        sys.stderr.flush()
    return message if code != 0 else None


def end_progress_line() -> None:
    """Before the launcher's own lines on a failed job: end the collector's progress line where it is open.

    In a terminal the collector rewrites its progress line in place (:mod:`gflowdist.runtime.progress`) on this
    process's stdout, which the ranks share through mpiexec, and a job that failed leaves it open: the
    collector was killed, or ended on its failure. Without a line break there, the failure's first line was
    glued to the last progress (``... modes 4/4gflowdist: the job failed (exit 3):``). Elsewhere (a pipe, a
    file) every progress line ends with its own line break: nothing to do."""
    try:
        if not sys.stdout.isatty():
            return
        sys.stdout.write("\n")
        sys.stdout.flush()
    except (AttributeError, ValueError, OSError):  # no stdout, or closed: no line to end
        return


def _failure_reported(relay: StderrRelay | None) -> bool:
    """A rank has written a failure we will believe (see :func:`_report_failure`)."""
    messages = _failure_messages()
    if relay is None:
        return bool(messages)
    return any(relay.seen(m.splitlines()[0]) for m in messages)


def _wait_for_orphans(
    grace_s: float, tracker: DescendantTracker, relay: StderrRelay | None, reaped: dict[int, int]
) -> None:
    """Let ranks that outlived their launcher report, reaping them as they exit.

    Ends after ``grace_s``, when none of the job's processes runs any more, or
    as soon as a failure has been reported (ranks cut off by a partition never
    report, and the rest of the job is killed anyway).
    """
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not _failure_reported(relay):
        _reap_children(reaped)
        if not tracker.running():
            return
        time.sleep(0.1)


def _reap_children(reaped: dict[int, int]) -> None:
    """Reap children and adopted orphans that have exited (their wait statuses into ``reaped``)."""
    try:
        while True:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            reaped[pid] = status
    except ChildProcessError:
        pass


def _helpers_seen(helpers: tuple[int, ...], reaped: dict[int, int]) -> str | None:
    """One line on a helper of the job (the warm parent) that ended badly, else None: when it dies, every rank
    it forked dies with it and none is left to say what happened."""
    _reap_children(reaped)  # a helper that ended since (a warm parent still running is not among them)
    for pid in helpers:
        status = reaped.get(pid)
        if status is None:
            continue
        if os.WIFSIGNALED(status):
            how = f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        elif os.WEXITSTATUS(status) != 0:
            how = f"exited with status {os.WEXITSTATUS(status)}"
        else:
            continue
        return (
            f"the warm parent (pid {pid}), which forked this host's ranks, {how}, and they ended with it, so none "
            f"could say what happened (docs/runtime.md#warm-start; the kernel's log, dmesg, names an out-of-memory "
            f"kill)"
        )
    return None


def unexplained(ended: Ended) -> str:
    """The launcher's line for a failed job no rank explained (after :meth:`Ended.judged_by`)."""
    why = ended.seen or "every rank ended before one could name the others (a rank killed by a signal says nothing)"
    return f"gflowdist: the job failed (exit {ended.code}) and no rank said why: {why}"


def _reap_leftovers(tracker: DescendantTracker) -> None:
    """Kill and reap every process of the job still alive (orphaned ranks were re-parented to us)."""
    for pid in tracker.kill():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # not our direct child (its own parent reaps it)
            pass


#: The signal (SIGINT or SIGTERM, counted together) that forces an exit: the first one stops the job cleanly and
#: the second is only counted (a Ctrl-C and a supervisor's SIGTERM; an impatient second Ctrl-C).
FORCE_AFTER_SIGNALS = 3
#: Signals within this many seconds of the last counted one are one signal: one ``kill -INT`` to a process group
#: under GNU ``timeout`` reaches the launcher up to three times (directly, then from ``timeout`` to its child and
#: to its group) within microseconds.
SIGNAL_BURST_S = 1.0
#: Once a stop's final checkpoint is intact, the seconds the job still gets for its report and ledger.
AFTER_CHECKPOINT_S = 60.0


def final_saved(run_dir: str | os.PathLike[str], since: float) -> bool:
    """A final checkpoint of ``run_dir`` completed (its manifest written) at or after ``since`` (epoch seconds)."""
    for manifest in Path(run_dir).glob("checkpoints/gen-*-final/MANIFEST.json"):
        try:
            if manifest.stat().st_mtime >= since:
                return True
        except OSError:
            continue
    return False


def say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a reentrant write, the handler ran inside one
        pass


def supervise(
    procs: list[subprocess.Popen],
    *,
    report_grace_s: float = 15.0,
    relay: StderrRelay | None = None,
    stop_grace_s: float = 60.0,
    saved: Callable[[], bool] | None = None,
    helpers: tuple[int, ...] = (),
) -> Ended:
    """Wait for the job; forward the first SIGINT/SIGTERM (the third forces an exit); if one process fails, stop
    the rest.

    Whatever happens, no process of the job outlives this call: the launcher is a
    child subreaper and kills its whole process tree at the end (hydra moves
    every rank into a session of its own, out of reach of a process-group kill),
    and then removes the topology file a killed hydra proxy would leave in
    ``/tmp`` (:mod:`gflowdist.cli.hydra_files`).

    When a rank dies, hydra (with ``-disable-auto-cleanup``) signals the others
    and exits at once; the surviving ranks, now re-parented to us, get
    ``report_grace_s`` to notice the loss and say which rank it was (less, once
    a failure is reported: see ``_wait_for_orphans``). ``relay`` reads
    mpiexec's stderr (see :mod:`gflowdist.cli.stderr_relay`). ``helpers`` are
    descendants that are not the job's and end by themselves afterwards (the
    warm parent, :mod:`gflowdist.cli.warm_parent`; the ranks it forks are the job's).
    """
    interrupted: list[int] = []
    tracker = DescendantTracker(os.getpid(), exempt=helpers)
    topology = TopologyFiles()  # what a killed hydra proxy would leave in /tmp
    reaped: dict[int, int] = {}  # pid -> wait status of the children reaped here (the warm parent among them)

    last = [-1e9]  # when the last counted signal came

    def forward(signum, _frame):
        now = time.monotonic()
        if now - last[0] < SIGNAL_BURST_S:  # the same signal again, by another route (a process group's)
            return
        last[0] = now
        interrupted.append(signum)
        if len(interrupted) == 1:  # once: a second signal makes hydra kill every rank at once (exit 255)
            for p in procs:
                if p.poll() is None:
                    kill_group(p.pid, signum)
        elif len(interrupted) < FORCE_AFTER_SIGNALS:
            say(
                f"gflowdist: {signal.Signals(signum).name} again: still stopping cleanly (checkpoint, report, "
                f"ledger); signal {FORCE_AFTER_SIGNALS} times to force an exit"
            )
        elif len(interrupted) == FORCE_AFTER_SIGNALS:
            say("gflowdist: forced exit: every process of the job is killed now; nothing more is saved")
            for p in procs:
                kill_group(p.pid)
            tracker.kill()

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        grace_until = None
        overran = checkpointed = False
        next_look = 0.0
        next_scan = 0.0
        while any(p.poll() is None for p in procs):
            if time.monotonic() >= next_scan:  # remember the ranks before their parents go
                tracker.scan()
                topology.note(tracker.seen)
                next_scan = time.monotonic() + 0.5
            ended_badly = [p for p in procs if p.poll() not in (None, 0)]
            if (ended_badly or _failure_reported(relay)) and grace_until is None:
                # a rank failed: the launcher (hydra) gets the same grace to end the job as orphans do, and the
                # collector the time to write the post-mortem before it ends the job (runtime.postmortem)
                grace_until = time.monotonic() + report_grace_s + (0.0 if ended_badly else POSTMORTEM_GRACE_S)
            if interrupted and grace_until is None:  # a stop (a preemption): faults.preempt_grace_s
                grace_until = time.monotonic() + stop_grace_s
            if interrupted and not checkpointed and saved is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + 0.2
                if saved():  # the final checkpoint is intact: what is left (the report) gets its own time
                    checkpointed = True
                    grace_until = max(grace_until or 0.0, time.monotonic() + AFTER_CHECKPOINT_S)
            if grace_until is not None and time.monotonic() > grace_until:
                overran = bool(interrupted) and not checkpointed
                break
            time.sleep(0.05)
        if not interrupted and any(p.returncode not in (None, 0) for p in procs):
            _wait_for_orphans(report_grace_s, tracker, relay, reaped)
    finally:
        topology.note(tracker.running())
        for p in procs:
            if p.poll() is None:
                kill_group(p.pid)
            p.wait()
        _reap_leftovers(tracker)
        for failure in topology.remove()[1]:
            say(f"gflowdist: {failure}")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.returncode for p in procs]
    failed = next((c for c in codes if c != 0), 0)
    forced = len(interrupted) >= FORCE_AFTER_SIGNALS or overran  # killed on purpose: the status is the signal's
    if interrupted and (forced or failed in (0, -signal.SIGINT, -signal.SIGTERM)):
        failed = 130 if interrupted[0] == signal.SIGINT else 143
    elif failed < 0:
        failed = 128 - failed
    if relay is not None:
        relay.join(0.5)  # the last lines mpiexec wrote
    message = _report_failure(failed, relay)
    seen = _helpers_seen(helpers, reaped) if failed and message is None else None
    return Ended(failed, message, interrupted=bool(interrupted), overran=overran, seen=seen)
