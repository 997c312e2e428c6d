"""SIGINT/SIGTERM to ``gflowdist run`` once or twice, also to its process group under GNU ``timeout``, end
in the documented clean stop (final checkpoint, report, balanced ledger); a deliberate third forces an exit.

Real 4-rank toy jobs under mpiexec. Before: the launcher forwarded every
signal to mpiexec, and hydra answers a second SIGINT by killing every rank
at once (exit 255 within 0.2 s, nothing saved); one ``kill -INT`` to the
launcher's process group under GNU ``timeout`` reaches the launcher up to
three times.
"""

from __future__ import annotations

import os
import signal
import time

from tests.support.jobs import read_json


def _stopped_cleanly(job, run, code: int) -> None:
    assert job.wait(90) == code, job.output
    assert read_json(run / "ledger.json")["balanced"]
    assert (run / "checkpoints" / "gen-0000-final" / "MANIFEST.json").exists(), job.output
    assert (run / "report.txt").exists()
    assert "forced exit" not in job.output
    assert job.no_process_left()


def test_two_sigints_to_the_launcher_still_stop_cleanly(job_factory):
    # trainers' steps take 4 s from step 12 on: the clean stop waits for the step in progress, so the second
    # Ctrl-C comes while the job is still stopping, however fast its end is
    job = job_factory("run.steps=100000", "params.slow_s=4", "params.slow_from=12")
    run = job.wait_for_metrics(2)
    time.sleep(1.0)  # into a slow step
    job.proc.send_signal(signal.SIGINT)
    time.sleep(1.2)  # a second, separate Ctrl-C
    job.proc.send_signal(signal.SIGINT)
    _stopped_cleanly(job, run, 130)
    assert "SIGINT again: still stopping cleanly" in job.output, job.output


def test_a_signal_to_the_process_group_under_gnu_timeout_stops_cleanly(job_factory):
    # the launcher runs under `timeout`, which leads the process group: one kill -TERM to the group
    # reaches the launcher directly and twice through timeout (to its child, then to its group)
    job = job_factory("run.steps=100000", "params.delay_s=0.01", prefix=("timeout", "-s", "TERM", "600"))
    run = job.wait_for_metrics(4)
    os.killpg(job.proc.pid, signal.SIGTERM)
    _stopped_cleanly(job, run, 143)  # timeout exits with its command's status


def test_a_third_signal_forces_an_exit(job_factory):
    # trainers' steps take 6 s from step 12 on: a clean stop would wait for the step in progress
    job = job_factory("run.steps=100000", "params.slow_s=6", "params.slow_from=12")
    run = job.wait_for_metrics(2)
    time.sleep(1.0)  # into a slow step
    for _ in range(3):
        job.proc.send_signal(signal.SIGINT)
        time.sleep(1.2)
    assert job.wait(30) == 130, job.output
    assert "forced exit" in job.output, job.output
    assert not (run / "checkpoints" / "gen-0000-final").exists()  # nothing more was saved
    assert job.no_process_left()
