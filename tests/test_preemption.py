"""Preemption: SIGTERM to ``gflowdist run`` stops the job within ``faults.preempt_grace_s`` with a
checkpoint, says it is resumable and how, and ``--resume`` goes on with nothing lost or repeated.

Real 4-rank toy jobs under mpiexec. A stop that cannot finish within the
grace is killed, says so, and leaves the previous intact checkpoint as the
one ``--resume`` uses. A grace not above ``faults.peer_timeout_s`` is a
config error naming both keys.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gflowdist.rundir import newest_intact
from tests.support.jobs import TOY, read_json
from tests.support.launching import MARKER_VARIABLE, REPO, base_env, kill_session, new_marker


@pytest.mark.parametrize(
    "sync",
    [(), ("sync.mode=models", "sync.every=4")],
    ids=["gradients", "models"],  # the stop vote rides in the gradient average / is posted a step ahead
)
def test_sigterm_preempts_resumably_and_resume_finishes_with_each_step_once(job_factory, sync):
    first = job_factory("run.steps=60", "params.delay_s=0.02", "run.log_every=1", *sync)
    run = first.wait_for_metrics(6)
    first.proc.send_signal(signal.SIGTERM)
    signalled, saved = time.monotonic(), None
    manifest = run / "checkpoints" / "gen-0000-final" / "MANIFEST.json"
    while first.proc.poll() is None and time.monotonic() - signalled < 60:
        if saved is None and manifest.exists():
            saved = time.monotonic() - signalled
        time.sleep(0.05)
    assert first.wait(5) == 143, first.output
    print(f"SIGTERM to final checkpoint {saved} s, to exit {time.monotonic() - signalled:.2f} s")
    name, _ = newest_intact(run, 4)
    assert name == "gen-0000-final"
    last = first.output.strip().splitlines()[-1]
    assert last == f"gflowdist: stopped by SIGTERM; resume with: gflowdist run --resume {run}", first.output
    assert "did not stop within" not in first.output  # the checkpoint was intact in time; the report got its own
    stopped_at = read_json(run / "finals.json")["0"]["step"]
    assert 0 < stopped_at < 60
    second = job_factory("--resume", str(run), config=None)
    second.out_dir = run.parent
    assert second.wait(120) == 0, second.output
    assert read_json(run / "finals.json")["0"]["step"] == 60
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and ledger["totals"]["produced"] == 60 * 8 * 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trainer_rows = [(row["rank"], row["step"]) for row in rows if row["rank"] in (0, 1)]
    assert len(trainer_rows) == len(set(trainer_rows))  # each (rank, step) once across the generations
    assert {step for rank, step in trainer_rows if rank == 0} == set(range(60))
    assert first.no_process_left() and second.no_process_left()


def test_a_stop_over_the_grace_is_killed_and_keeps_the_previous_checkpoint(job_factory):
    # the coordinator's final summary takes 60 s, longer than the 8 s grace: the final checkpoint,
    # whose manifest the coordinator writes once every final report is in, cannot be completed
    job = job_factory(
        "run.steps=100000",
        "params.delay_s=0.01",
        "faults.checkpoint_every=5",
        "faults.preempt_grace_s=8",
        "params.final_summary_s=60",
    )
    run = job.wait_for_metrics(2)
    deadline = time.monotonic() + 60
    while not list((run / "checkpoints").glob("gen-0000-step-*/MANIFEST.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    before, _ = newest_intact(run, 4)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(60) == 143, job.output
    assert "did not stop within faults.preempt_grace_s = 8 s and was killed" in job.output, job.output
    assert not (run / "checkpoints" / "gen-0000-final" / "MANIFEST.json").exists()
    after, _ = newest_intact(run, 4)  # the previous intact checkpoint is the one resume uses
    assert after.startswith("gen-0000-step-") and after >= before
    assert job.output.strip().splitlines()[-1] == (
        f"gflowdist: interrupted; resume with: gflowdist run --resume {run} (from checkpoint {after})"
    ), job.output
    assert job.no_process_left()


def test_a_grace_not_above_the_peer_timeout_is_one_line_naming_both_keys(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", str(TOY), "faults.preempt_grace_s=5", f"run.out_dir={tmp_path}"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert "\n" not in line and "faults.preempt_grace_s: must be greater than faults.peer_timeout_s (6)" in line
    assert not list(tmp_path.iterdir())


def test_the_slurm_recipe_passes_sigterm_on_requeues_and_resumes(tmp_path):
    """docker/slurm/preemptible.sbatch run by bash as Slurm would (its variables, a stand-in scontrol):
    SIGTERM to the batch shell only (``--signal=B:TERM``) stops the job resumably and requeues it; the
    requeued start (SLURM_RESTART_COUNT=1) resumes the same run directory to its end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = base_env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        VENV=str(Path(sys.executable).parent.parent),
        OUT_DIR=str(tmp_path / "runs"),
        CONFIG=str(TOY),
        SLURM_JOB_ID="4242",
        SLURM_NTASKS="4",
    )
    script = [str(REPO / "docker" / "slurm" / "preemptible.sbatch"), "run.steps=40", "params.delay_s=0.02"]

    def start(restart: int, log: str) -> subprocess.Popen:
        marker = new_marker()
        proc = subprocess.Popen(
            ["bash", *script],
            env=dict(env, SLURM_RESTART_COUNT=str(restart), **{MARKER_VARIABLE: marker}),
            stdout=open(tmp_path / log, "w"),
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
        proc.gflowdist_marker = marker
        return proc

    first = start(0, "first.log")
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            rows = list((tmp_path / "runs" / "job-4242").glob("*/metrics.jsonl"))
            if rows and len(rows[0].read_text().splitlines()) >= 3:
                break
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            time.sleep(0.1)
        first.send_signal(signal.SIGTERM)  # to the batch shell only, as --signal=B:TERM does
        assert first.wait(60) == 143, (tmp_path / "first.log").read_text()
    finally:
        kill_session(first)
    out = (tmp_path / "first.log").read_text()
    assert "gflowdist: stopped by SIGTERM; resume with: gflowdist run --resume" in out, out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    (run,) = (tmp_path / "runs" / "job-4242").iterdir()
    assert read_json(run / "finals.json")["0"]["step"] < 40
    second = start(1, "second.log")
    try:
        assert second.wait(120) == 0, (tmp_path / "second.log").read_text()
    finally:
        kill_session(second)
    assert f"resuming {run}" in (tmp_path / "second.log").read_text()
    assert read_json(run / "finals.json")["0"]["step"] == 40 and read_json(run / "ledger.json")["balanced"]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]  # not requeued again
