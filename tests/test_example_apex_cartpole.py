"""examples/apex_cartpole: the Ape-X DQN job end to end (scaled down) and the single-process baseline.

The job runs on 5 real ranks under mpiexec (2 actors, 1 buffer, 1 learner, 1
coordinator) for a few hundred learner steps: transitions flow with their
initial priorities, every replayed batch's new priorities reach the buffer,
the coordinator evaluates the weights it is sent, actors report episode
returns, and the ledger balances for transitions. Reaching the return itself
is the benchmark's job (benchmarks/apex_cartpole.py), not a test's.
"""

from __future__ import annotations

import importlib.util
import json

from tests.support.jobs import read_json
from tests.support.launching import REPO

EXAMPLE = REPO / "examples" / "apex_cartpole"
STEPS, BATCH = 300, 32
SMALL = [
    f"run.steps={STEPS}",
    "run.log_every=20",
    "replay.capacity=4000",
    "replay.min_size_to_sample=256",
    f"replay.learner_batch={BATCH}",
    "sync.weights_to_coordinator_every=100",
    "params.eval_episodes=2",
    "params.hidden=32",
    "params.target_return=100000",
]


def test_apex_job_closes_the_priority_loop_and_balances_its_ledger(job_factory):
    job = job_factory(*SMALL, config=EXAMPLE / "config.yaml")
    assert job.wait(150) == 0, job.output
    run = job.run_dir()
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    finals = {int(rank): final for rank, final in read_json(run / "finals.json").items()}
    roles = {rank: final["role"] for rank, final in finals.items()}
    learner = finals[next(r for r, role in roles.items() if role == "trainer")]
    buffer = next(f for f in finals.values() if f["role"] == "buffer")["replay"]
    actors = [f for f in finals.values() if f["role"] == "actor"]
    produced = sum(a["ledger"]["produced"] for a in actors)
    assert learner["step"] == STEPS and learner["ledger"]["produced"] == 0  # a pure learner
    assert produced == buffer["offered"] == ledger["totals"]["admitted"] > 0  # transitions, counted once
    assert buffer["initial_priorities"] == buffer["admitted"]  # every transition came with the actor's |td|
    # every replayed batch the learner learned from sent its |td| back, stale or not
    assert buffer["priority_updates"] + buffer["stale_priority_updates"] == STEPS * BATCH
    assert buffer["priority_updates"] > 0
    curve = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]["curve"]
    assert [point["learner_steps"] for point in curve] == [100, 200, 300]
    assert all(0 < point["eval_return"] <= 500 for point in curve)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    actor_ranks = {r for r, role in roles.items() if role == "actor"}
    returns = [row["episode_return"] for row in rows if row["rank"] in actor_ranks and "episode_return" in row]
    assert returns and all(row["env_steps"] > 0 for row in rows if row["rank"] in actor_ranks)
    coordinator = next(r for r, role in roles.items() if role == "coordinator")
    evaluated = [(row["step"], row["eval_return"]) for row in rows if row["rank"] == coordinator]
    assert evaluated == [(p["learner_steps"], p["eval_return"]) for p in curve]  # Coordinator.record's rows
    report_curves = {m["name"] for m in read_json(run / "report.json")["metrics"]}
    assert "eval_return" in report_curves
    assert job.no_process_left()


def test_single_process_baseline_learns_with_the_same_classes():
    spec = importlib.util.spec_from_file_location("apex_single_process", EXAMPLE / "single_process.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps = 200
    config = module.Config.from_yaml(EXAMPLE / "config.yaml", [*SMALL, f"run.steps={steps}"])
    result = module.train(config, log=lambda line: None)
    assert result["learner_steps"] == steps and not result["solved"]
    assert [point["learner_steps"] for point in result["curve"]] == [100, 200]
    # acting and learning alternate by the pacing rule (gflowdist.rl.env_actor): the actor stops at
    # min_size_to_sample + env_steps_per_update * (version + weights_to_actors_every), one rollout
    # (8 envs x 8 steps) at most beyond it
    assert 0 <= result["env_steps"] - (256 + 16 * (steps - 1 + 20)) <= 64, result["env_steps"]
