"""Inference ranks (layout.inference) on real ranks under mpiexec: the Ape-X example with their
config_inference.yaml (scaled down) at inference.split 1 and 2, the IMPALA example at split 2 and a lost
inference rank; on the local engine (ranks as threads of this process, tests/support/local_jobs.py): a request
whose observation shape changes, and the same job run to its end (tests/jobs/inference.yaml: split 2, one
environment per group).

What is checked: the actors get no weights (no load_weights phase; their policy runs on the inference
rank, which loads the learner's weights), every request is answered in some batch, the ledger balances,
the report has the inference section, the unrolls' policy versions stay within replay.max_staleness.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gflowdist.runtime.tape import Site, read_recording, recording_path
from tests.support.jobs import pid_of_rank, read_json
from tests.support.launching import REPO

JOBS = REPO / "tests" / "jobs"
APEX = REPO / "examples" / "apex_cartpole"
IMPALA = REPO / "examples" / "impala_cartpole"


def _finals(run) -> dict[int, dict]:
    return {int(rank): final for rank, final in read_json(run / "finals.json").items()}


def _check_served(finals: dict[int, dict], run) -> dict:
    """The inference rank answered every actor request, the actors loaded no weights; its stats."""
    (server,) = [f for f in finals.values() if f["role"] == "inference"]
    actors = [f for f in finals.values() if f["role"] == "actor"]
    stats = server["inference"]
    assert stats["batches"] > 0 and stats["requests"] >= stats["batches"] and stats["refused"] == 0
    assert sum(int(size) * n for size, n in stats["sizes"].items()) == stats["observations"]
    assert sum(stats["closed_by"].values()) == stats["batches"]
    assert all(int(size) <= stats["max_batch"] for size in stats["sizes"])
    assert all(f["loop_cpu_s"] > 0 for f in [server, *actors])  # the CPU their loops used (benchmarks read it)
    assert "load_weights" in server["timing"]["phases"]  # the learner's weights reach the inference rank
    assert all("load_weights" not in a["timing"]["phases"] for a in actors)  # and never an actor
    # every request an actor waited for was answered (its waits on the inference rank are in its timer)
    rank = next(r for r, f in finals.items() if f["role"] == "inference")
    assert all(a["timing"]["waits"][str(rank)]["inference"] > 0 for a in actors)
    text = (run / "report.txt").read_text()
    assert "Inference (actors' policy run centrally" in text and f"  rank {rank} on " in text
    return stats


@pytest.mark.parametrize("split", [1, 2])
def test_apex_example_with_an_inference_rank(job_factory, split):
    steps = 200
    job = job_factory(
        f"inference.split={split}",
        f"run.steps={steps}",
        "run.log_every=20",
        "replay.capacity=4000",
        "replay.min_size_to_sample=256",
        "replay.learner_batch=32",
        "sync.weights_to_coordinator_every=100",
        "params.eval_episodes=2",
        "params.hidden=32",
        "params.target_return=100000",
        config=APEX / "config_inference.yaml",
    )
    assert job.wait(200) == 0, job.output
    run = job.run_dir()
    assert read_json(run / "ledger.json")["balanced"]
    finals = _finals(run)
    stats = _check_served(finals, run)
    learner = next(f for f in finals.values() if f["role"] == "trainer")
    buffer = next(f for f in finals.values() if f["role"] == "buffer")["replay"]
    assert learner["step"] == steps
    produced = sum(f["ledger"]["produced"] for f in finals.values() if f["role"] == "actor")
    # one request per vector step of each of the `split` groups of 4 / split environments, each step's transitions
    # shipped (n-step: all but the last 2)
    assert stats["observations"] == stats["requests"] * 4 // split
    assert produced <= stats["observations"] and buffer["admitted"] == produced > 0
    assert buffer["initial_priorities"] == 0  # actors without weights send no |td|: the buffer's largest priority
    assert job.no_process_left()


def test_impala_example_with_an_inference_rank(job_factory):
    steps, stale = 120, 6
    job = job_factory(
        f"run.steps={steps}",
        "run.log_every=10",
        "replay.capacity=32",
        "replay.learner_batch=8",
        f"replay.max_staleness={stale}",
        "sync.weights_to_coordinator_every=60",
        "params.envs_per_actor=4",
        "inference.split=2",
        "params.unroll_length=16",
        "params.eval_episodes=2",
        "params.target_return=100000",
        config=IMPALA / "config_inference.yaml",
    )
    assert job.wait(240) == 0, job.output
    run = job.run_dir()
    assert read_json(run / "ledger.json")["balanced"]
    finals = _finals(run)
    stats = _check_served(finals, run)
    learner = next(f for f in finals.values() if f["role"] == "trainer")
    assert learner["step"] == steps
    lags = {int(k): v for k, v in learner["staleness"].items()}
    assert sum(lags.values()) == steps * 8 and max(lags) <= stale
    produced = sum(f["ledger"]["produced"] for f in finals.values() if f["role"] == "actor")
    assert stats["observations"] == produced * 16  # one observation per unroll step, each acted on centrally
    assert stats["observations"] == stats["requests"] * 2  # each request: one group of 2 of the 4 environments
    assert job.no_process_left()


def test_a_request_whose_observation_shape_changes_is_refused_naming_the_actor(local_job_factory):
    # the inference loop's check, on the local engine (ranks as threads); real ranks serve requests above
    job = local_job_factory("params.shift_rank=2", "params.shift_after=16", config=JOBS / "inference.yaml")
    assert job.wait(120) != 0
    # inference.split 2 (inference.yaml): 2 groups of 1 environment, a rollout of 4 vector steps asks 8 times (its
    # first 2 requests before any step); 16 environment steps are 2 rollouts, so the shift starts at request 16
    assert (
        "inference rank 4 refused a request: actor rank 2 sent request 16 with observation shape (5,) float32, "
        "expected (4,) float32" in job.output
    ), job.output
    assert "rank 2 (actor on " in job.output
    assert job.no_process_left()


def test_a_lost_inference_rank_is_named(job_factory):
    timeout = 3.0
    job = job_factory(
        "run.steps=100000", f"faults.peer_timeout_s={timeout}", "run.log_every=2", config=JOBS / "inference.yaml"
    )
    run = job.wait_for_metrics(4)
    os.kill(pid_of_rank(run, 4), signal.SIGKILL)
    killed = time.monotonic()
    code = job.wait(90)
    assert code != 0
    assert "lost rank 4 (inference on" in job.output, job.output
    assert time.monotonic() - killed < 3 * timeout + 40
    assert job.no_process_left()


def test_the_same_job_on_the_local_engine(local_job_factory):
    # in this process (the CLI's local-engine entry as a process: tests/test_engine_local.py)
    job = local_job_factory("launch.engine=local", config=JOBS / "inference.yaml")
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    assert read_json(run / "ledger.json")["balanced"]
    finals = _finals(run)
    _check_served(finals, run)
    assert finals[0]["step"] == 60


def _rows(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


def test_a_recorded_run_with_an_inference_rank_replays_to_the_bit(job_factory):
    """Which requests the inference rank took, in which order, and which ran together (INFER, SERVE), and when
    its weights came (INBOX) are replayed as recorded: the same batches, the same losses, the same metrics."""
    settings = ["run.steps=40", "faults.peer_timeout_s=20"]
    recorded = job_factory(*settings, "--record", config=JOBS / "inference.yaml")
    assert recorded.wait(240) == 0, recorded.output
    run = recorded.run_dir()
    replay = job_factory(str(run), command="replay", config=None)
    assert replay.wait(240) == 0, replay.output
    assert "gflowdist: replay identical" in replay.output, replay.output
    replayed = Path(read_json(next((run / "replays").glob("*/replay.json")))["replayed"])
    assert _rows(replayed) == _rows(run) and _rows(run)
    assert read_json(replayed / "ledger.json")["per_rank"] == read_json(run / "ledger.json")["per_rank"]
    served, again = _finals(run)[4]["inference"], _finals(replayed)[4]["inference"]
    assert served["batches"] > 0
    # the inference rank's recording: each request and done it took (INFER), each batch it ran (SERVE)
    _, events, complete = read_recording(recording_path(run, 4))
    assert complete and sum(e[0] == Site.SERVE for e in events) == served["batches"]
    assert sum(e[0] == Site.INFER for e in events) == served["requests"] + 2  # + each of the 2 actors' done
    for key in ("batches", "requests", "observations", "sizes"):  # the same requests batched together
        assert again[key] == served[key], key
    assert recorded.no_process_left() and replay.no_process_left()
