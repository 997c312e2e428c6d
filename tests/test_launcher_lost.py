"""Whatever kills ``gflowdist run`` (SIGKILL here), its job ends: mpiexec, hydra's proxies and every rank.

Real 4-rank toy jobs under mpiexec and on the torch engine. The launcher is
SIGKILLed mid-run; every process carrying the job's marker (launcher,
mpiexec, proxies, keepers, ranks: found in /proc, since hydra gives each rank
a session of its own) must be gone within ``faults.peer_timeout_s`` + 10 s,
and the run directory must say that the launcher was lost. Before the
lifeline (gflowdist.lifeline), 4 ranks of such a job still trained 14
minutes after their launcher was killed.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gflowdist.lifeline import LOST_FILE
from tests.support.jobs import read_json

TIMEOUT = 4.0


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_sigkill_of_the_launcher_leaves_no_process_of_its_job(job_factory, engine):
    job = job_factory("run.steps=100000", "params.delay_s=0.01", f"faults.peer_timeout_s={TIMEOUT}", "--engine", engine)
    run = job.wait_for_metrics(4)
    launcher = job.proc.pid
    assert len(job.processes_left()) >= 5  # the launcher and its 4 ranks at least
    os.kill(launcher, signal.SIGKILL)
    killed = time.monotonic()
    job.proc.wait()
    left = job.processes_left()
    while left and time.monotonic() - killed < TIMEOUT + 10:
        time.sleep(0.1)
        left = job.processes_left()
    elapsed = time.monotonic() - killed
    print(f"{engine}: every process of the job ended {elapsed:.2f} s after the launcher's SIGKILL")
    assert left == [], f"still running {elapsed:.1f} s after the launcher was killed: {left}"
    notes = (run / LOST_FILE).read_text()
    assert f"the launcher (gflowdist run, pid {launcher}) is gone" in notes, notes
    assert len(notes.splitlines()) >= 4  # every rank (all on this host) saw it
    assert not (run / ".launch-config.yaml").exists()  # what the launcher would have removed at the end
    # the ranks stopped as on a signal where they could within the bound: then the ledger is whole
    if (run / "ledger.json").exists():
        assert read_json(run / "ledger.json")["balanced"]
        assert "the launcher was lost" in job.output, job.output
