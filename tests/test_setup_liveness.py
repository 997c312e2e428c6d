"""A rank killed during its setup is named at once, by rank, role and host, and no other rank is blamed.

Real 4-rank toy jobs under mpiexec (trainers 0-1, buffer 2, coordinator 3).
The victim's setup() sleeps 60 s; the test SIGKILLs its process once its log
line is written, while the other ranks wait at the start-up barrier. Before
gflowdist.runtime.setup_watch, the loss went unnoticed until
``faults.startup_timeout_s`` (300 s by default) and the job then blamed a
live rank with a ``DeadlineError``.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.support.jobs import pid_of_rank

TIMEOUT = 4.0


@pytest.mark.parametrize("victim,role", [(2, "buffer"), (3, "coordinator")])
def test_a_rank_killed_during_setup_is_named_within_the_peer_timeout(job_factory, victim, role):
    job = job_factory(f"params.setup_rank={victim}", "params.setup_s=120", f"faults.peer_timeout_s={TIMEOUT}")
    deadline = time.monotonic() + 90
    log = None
    while time.monotonic() < deadline:
        logs = list(job.out_dir.glob(f"*/logs/rank-{victim}.log"))
        if logs and " pid " in logs[0].read_text():
            log = logs[0]
            break
        assert job.proc.poll() is None, job.output
        time.sleep(0.1)
    assert log is not None, job.output
    time.sleep(1.0)  # the others reach the start-up barrier
    os.kill(pid_of_rank(log.parent.parent, victim), signal.SIGKILL)
    killed = time.monotonic()
    code = job.wait(TIMEOUT + 60)
    elapsed = time.monotonic() - killed
    print(f"{role}: named and the job ended {elapsed:.2f} s after the kill")
    assert code != 0
    assert f"lost rank {victim} ({role} on" in job.output, job.output
    assert "ended during setup" in job.output, job.output
    blamed = set(re.findall(r"lost rank (\d+)", job.output)) | set(
        re.findall(r"rank (\d+) \(\w+ on [^)]*\) failed", job.output)
    )
    assert blamed == {str(victim)}, job.output
    assert "DeadlineError" not in job.output
    assert elapsed < TIMEOUT + 30  # not the start-up deadline (300 s)
    assert job.no_process_left()
