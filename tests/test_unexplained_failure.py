"""A failed job no rank explained: the launcher says so, and what it saw end (the warm parent, killed).

When the warm parent dies (the kernel's out-of-memory killer picks the biggest process, and the warm
parent holds torch), every rank it forked dies with it: no rank is left to name anything, and the
launcher used to end with mpiexec's 137 and not one line.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from gflowdist.cli.restarts import Ended
from gflowdist.cli.supervise import _helpers_seen, unexplained


def test_a_killed_warm_parent_is_named_when_its_ranks_ended_with_it(job_factory):
    job = job_factory("run.steps=100000", "params.delay_s=0.005", "launch.warm_start=true")
    run = job.wait_for_metrics(4)
    start = re.search(
        r"started warm: forked by the warm parent \(pid (\d+)\)", (run / "logs" / "rank-0.log").read_text()
    )
    assert start, (run / "logs" / "rank-0.log").read_text()
    parent = int(start.group(1))
    os.kill(parent, signal.SIGKILL)
    killed = time.monotonic()
    code = job.wait(60)
    assert code == 137, job.output
    line = next((line for line in job.output.splitlines() if "no rank said why" in line), None)
    assert line == (
        f"gflowdist: the job failed (exit 137) and no rank said why: the warm parent (pid {parent}), which forked "
        f"this host's ranks, was killed by SIGKILL, and they ended with it, so none could say what happened "
        f"(docs/runtime.md#warm-start; the kernel's log, dmesg, names an out-of-memory kill)"
    ), job.output
    assert f"gflowdist: the ranks' logs: {run / 'logs'}" in job.output.splitlines(), job.output
    assert time.monotonic() - killed < 30
    assert job.no_process_left(), job.processes_left()


def test_without_a_helper_that_ended_badly_the_line_says_no_rank_could():
    assert unexplained(Ended(134)) == (
        "gflowdist: the job failed (exit 134) and no rank said why: every rank ended before one could name the "
        "others (a rank killed by a signal says nothing)"
    )


def test_a_helper_is_named_only_when_it_ended_badly():
    ok = subprocess.Popen([sys.executable, "-c", "pass"])
    bad = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reaped: dict[int, int] = {}
        for pid in (ok.pid, bad.pid):
            reaped[pid] = os.waitpid(pid, 0)[1]  # as the launcher's reaping records them
        assert _helpers_seen((ok.pid, running.pid), reaped) is None
        assert f"the warm parent (pid {bad.pid}), which forked this host's ranks, exited with status 3" in str(
            _helpers_seen((ok.pid, running.pid, bad.pid), reaped)
        )
    finally:
        running.kill()
        running.wait()
        for proc in (ok, bad):
            proc.returncode = 0  # reaped above: nothing left for Popen to wait for
