"""The runtime end to end, through the real CLI, under mpiexec (and once under gloo).

Every job runs in its own session with a deadline (``tests.support.jobs.Job``); each
test checks that no process of the job is left when the launcher has returned.
Checks of what a job computes and writes (weights reaching actors, replicas, a
resume's steps and ledger) run on the ``local`` engine instead (ranks as threads
of this process, the same protocol and loops: ``tests.support.local_jobs``);
a normal run, a failure's console, signals and kill -9 stay under mpiexec.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.support.jobs import pid_of_rank, read_json


def test_normal_run_balances_and_writes_the_run_directory(job_factory):
    job = job_factory("report.figure=true")  # the suite skips the figure unless asked (tests/conftest.py)
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    for name in (
        "config.yaml",
        "layout.txt",
        "metrics.jsonl",
        "ledger.json",
        "finals.json",
        "report.txt",
        "report.json",
        "report.png",
        "logs/rank-0.log",
        "checkpoints/gen-0000-final/MANIFEST.json",
    ):
        assert (run / name).exists(), name
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and ledger["totals"]["produced"] == 30 * 8 * 2  # steps x n x trainers
    assert ledger["totals"]["produced"] == ledger["totals"]["admitted"]
    finals = read_json(run / "finals.json")
    assert finals["2"]["replay"]["admitted"] == 480 and finals["2"]["replay"]["sampled"] > 0
    for rank in ("0", "1"):  # replay_fraction 0.5 (toy.yaml): a reply used holds as many trajectories as the 8 fresh
        used = sum(finals[rank]["staleness"].values())
        assert 0 < used <= 8 * 29 and used % 8 == 0, (rank, finals[rank]["staleness"])
    # every role got its device (launch.devices auto, no GPU here: the CPU) as self.device
    assert {final["summary"]["device"] for final in finals.values()} == {"cpu"}
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m["w_error"] for m in metrics if m["rank"] == 0]
    assert trained[-1] < trained[0] / 2  # the toy model learned
    assert "ledger balanced" in job.output and "Load imbalance" in (run / "report.txt").read_text()
    assert job.no_process_left()


def test_actors_receive_weights_and_staleness_is_reported(local_job_factory):
    job = local_job_factory("layout.trainers=1", "layout.actors=2", "-n", "5", "run.steps=40")
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    finals = read_json(run / "finals.json")
    roles = {r: f["role"] for r, f in finals.items()}
    actors = [r for r, role in roles.items() if role == "actor"]
    assert len(actors) == 2
    assert all(finals[a]["ledger"]["produced"] > 0 for a in actors)
    assert all(finals[a]["summary"]["weight_updates"] > 0 for a in actors)
    trainer = next(r for r, role in roles.items() if role == "trainer")
    staleness = {int(k): v for k, v in finals[trainer]["staleness"].items()}
    assert sum(staleness.values()) > 0 and max(staleness) > 0  # replayed actor data is older than the learner
    assert read_json(run / "ledger.json")["balanced"]
    assert job.no_process_left()


def test_exception_on_a_buffer_ends_the_job_with_its_traceback(job_factory):
    job = job_factory("params.fail_in_buffer_after=40", "run.steps=100000")
    code = job.wait(120)  # start-up, the failure, the post-mortem (report.png takes seconds on a loaded machine)
    assert code != 0
    out = job.output
    assert "rank 2 (buffer on" in out and out.count("ValueError: toy buffer failure on purpose") == 1, out
    # the user's frames, once, and where the whole traceback is (the rank's log)
    assert 'in your code (most recent call last):\n    File "' in out and "in on_admitted" in out, out
    assert "Traceback" not in out and "MPI_Abort" not in out and "logs/rank-2.log" in out, out
    assert (job.run_dir() / "report.txt").read_text().startswith("gflowdist run report -- PARTIAL")
    assert job.no_process_left()


def test_resume_continues_steps_ledger_and_buffer(local_job_factory):
    first = local_job_factory("run.steps=10")
    assert first.wait(120) == 0, first.output
    run = first.run_dir()
    before = read_json(run / "finals.json")
    with open(run / "metrics.jsonl", "a") as rows:  # what a generation that failed after the checkpoint wrote
        for step in range(10, 13):
            rows.write(json.dumps({"rank": 0, "time": 0.0, "step": step, "loss": 9.0}) + "\n")
    second = local_job_factory("run.steps=20", "--resume", str(run))
    second.out_dir = run.parent
    assert second.wait(120) == 0, second.output
    after = read_json(run / "finals.json")
    assert after["0"]["step"] == 20 and before["0"]["step"] == 10
    # the step is the checkpoint's (its manifest's), the steps done before it from the run's last progress.json
    assert "generation 1 (resumed); resumed from gen-0000-final at step 10, 0 steps repeated" in second.output
    assert read_json(run / "ledger.json")["totals"]["produced"] == 20 * 8 * 2
    assert after["2"]["replay"]["admitted"] == 2 * before["2"]["replay"]["admitted"]
    assert after["2"]["replay"]["size"] == 20 * 8 * 2  # trajectories admitted before the checkpoint are kept
    rows = [json.loads(item) for item in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows]
    assert max(steps) == 19 and steps.index(max(steps)) > steps.index(9)
    trainer_rows = [(row["rank"], row["step"]) for row in rows if row["rank"] in (0, 1)]
    assert len(trainer_rows) == len(set(trainer_rows)) and 9.0 not in [row.get("loss") for row in rows]
    assert (run / "checkpoints" / "gen-0001-final" / "MANIFEST.json").exists()


def test_sigint_stops_every_rank_and_writes_checkpoint_and_report(job_factory):
    job = job_factory("run.steps=100000", "params.delay_s=0.01")
    run = job.wait_for_metrics(6)
    job.proc.send_signal(signal.SIGINT)
    code = job.wait(60)
    assert code == 130, job.output
    assert read_json(run / "ledger.json")["balanced"]
    assert (run / "checkpoints" / "gen-0000-final" / "MANIFEST.json").exists() and (run / "report.txt").exists()
    assert "signal SIGINT" in job.output
    assert job.no_process_left()


# Each rank runs under a keeper process (gflowdist.cli.rank_keeper): without it, hydra's proxy
# SIGKILLed every survivor when it reaped the killed rank, about one run in three, and nobody
# named the lost rank.
@pytest.mark.parametrize("victim,role", [(1, "trainer"), (2, "buffer"), (3, "coordinator")])
def test_kill9_of_a_rank_ends_the_job_naming_it(job_factory, victim, role):
    timeout = 3.0
    job = job_factory(
        "run.steps=100000", "params.delay_s=0.005", f"faults.peer_timeout_s={timeout}", "faults.heartbeat_s=0.2"
    )
    run = job.wait_for_metrics(4)
    os.kill(pid_of_rank(run, victim), signal.SIGKILL)
    killed = time.monotonic()
    code = job.wait(60)
    elapsed = time.monotonic() - killed
    assert code != 0
    assert f"lost rank {victim} ({role} on" in job.output, job.output
    # noticed within 2 timeouts; then the post-mortem: the ranks' parts (at most a timeout), report.png, trace.json
    assert elapsed < 3 * timeout + 25, f"took {elapsed:.1f} s to notice and end"
    assert job.no_process_left()


def test_torch_engine_runs_the_same_job(job_factory):
    job = job_factory("--engine", "torch")
    assert job.wait(120) == 0, job.output
    ledger = read_json(job.run_dir() / "ledger.json")
    assert ledger["balanced"] and ledger["totals"]["produced"] == 480
    # the console shows what it shows under mpiexec: the collector (the last rank here) prints it
    assert "gflowdist: run directory " in job.output, job.output
    assert "gflowdist: ledger: balanced" in job.output and "gflowdist: done: 480 trajectories produced" in job.output
    assert job.no_process_left()


def test_bad_config_exits_2_with_one_line(local_job_factory):
    job = local_job_factory("layout.bufers=2")
    assert job.wait(30) == 2
    out = job.output.strip()
    assert "layout.bufers" in out and "did you mean 'buffers'" in out and "Traceback" not in out


def test_periodic_checkpoint_survives_a_crash_and_resumes(job_factory):
    """checkpoint_every: a consistent cut (trainer, actor, buffer, coordinator) that a killed run resumes from."""
    layout = ("layout.actors=1", "-n", "5", "faults.checkpoint_every=5", "faults.peer_timeout_s=4")
    first = job_factory("run.steps=100000", "params.delay_s=0.01", *layout)
    run = first.wait_for_metrics(2)
    deadline = time.monotonic() + 60
    while not list(run.glob("checkpoints/gen-0000-step-*/MANIFEST.json")):
        assert time.monotonic() < deadline, f"no periodic checkpoint:\n{first.output}"
        time.sleep(0.2)
    os.kill(pid_of_rank(run, 0), signal.SIGKILL)
    assert first.wait(60) != 0
    assert first.no_process_left()
    done = sorted(run.glob("checkpoints/gen-0000-step-*/MANIFEST.json"))
    step = int(done[-1].parent.name.rsplit("-", 1)[1])
    saved = {p.name for p in done[-1].parent.glob("rank-*.pt")}
    assert saved == {f"rank-{r:05d}.pt" for r in range(5)}
    second = job_factory(f"run.steps={step + 10}", "--resume", str(run), *layout)
    second.out_dir = run.parent
    assert second.wait(120) == 0, second.output
    finals = read_json(run / "finals.json")
    trainers = [f for f in finals.values() if f["role"] == "trainer"]
    assert all(f["step"] == step + 10 for f in trainers)
    assert read_json(run / "ledger.json")["balanced"]
    buffer = next(f for f in finals.values() if f["role"] == "buffer")
    assert buffer["replay"]["admitted"] >= step * 8 * 2  # what the trainers produced before the cut is kept
    assert (run / "checkpoints" / "gen-0001-final" / "MANIFEST.json").exists()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    keys = [(row["rank"], row["step"]) for row in rows]
    assert len(keys) == len(set(keys)), "metrics rows of the steps after the checkpoint appear twice"
    assert {step for _, step in keys} >= {step, step + 9}
    assert second.no_process_left()


def test_trainers_are_replicas_and_actors_start_from_the_trainers_weights(local_job_factory):
    """Gradient averaging keeps trainers identical only if they start identical: the runtime syncs them."""
    import torch

    job = local_job_factory("run.steps=5", "layout.actors=1", "-n", "5")
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    final = sorted((run / "checkpoints").glob("gen-0000-final"))[0]
    finals = read_json(run / "finals.json")
    trainers = sorted(int(r) for r, f in finals.items() if f["role"] == "trainer")
    models = [torch.load(final / f"rank-{r:05d}.pt", weights_only=True)["role"]["model"] for r in trainers]
    assert len(models) == 2
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key
    actor = next(f for f in finals.values() if f["role"] == "actor")
    assert actor["summary"]["weight_updates"] >= 1


def test_on_a_crowded_machine_the_trainers_average_through_shared_memory_and_stay_replicas(job_factory):
    """4 ranks held to one CPU: the trainers' agent group reduces through shared memory (gflowdist.comm.host_reduce)
    under real mpiexec ranks, and its gradient averages keep the trainers identical."""
    import torch

    job = job_factory("run.steps=20", prefix=("taskset", "-c", "0"))
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    log = (run / "logs" / "rank-0.log").read_text()
    assert "4 ranks of this job on 1 core here: waits for peers use short spins" in log, log
    assert "all_reduce of these 2 ranks runs through shared memory" in log, log
    final = sorted((run / "checkpoints").glob("gen-0000-final"))[0]
    models = [torch.load(final / f"rank-{r:05d}.pt", weights_only=True)["role"]["model"] for r in (0, 1)]
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key
    assert job.no_process_left()
