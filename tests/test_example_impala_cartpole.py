"""examples/impala_cartpole: the IMPALA job end to end on 5 real ranks (scaled down).

2 unroll actors, 1 queue buffer, 1 V-trace learner, 1 coordinator under
mpiexec for a few hundred learner steps: every unroll is served once or
accounted for (stale, parked), the ledger balances, the learner's lag stays
within replay.max_staleness, and the actors' episodes get longer (it learns
something). Reaching 475 is the full example's job (docs/rl.md), not a test's.
"""

from __future__ import annotations

import json

from tests.support.jobs import read_json
from tests.support.launching import REPO

EXAMPLE = REPO / "examples" / "impala_cartpole"
STEPS, BATCH, STALE = 240, 8, 6
SMALL = [
    f"run.steps={STEPS}",
    "run.log_every=10",
    "replay.capacity=32",
    f"replay.learner_batch={BATCH}",
    f"replay.max_staleness={STALE}",
    "sync.weights_to_coordinator_every=80",
    "params.envs_per_actor=4",
    "params.unroll_length=16",
    "params.lr=0.002",
    "params.eval_episodes=2",
    "params.target_return=100000",
]


def test_impala_job_serves_every_unroll_once_within_the_lag_and_learns(job_factory):
    job = job_factory(*SMALL, config=EXAMPLE / "config.yaml")
    assert job.wait(240) == 0, job.output
    run = job.run_dir()
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    finals = {int(rank): final for rank, final in read_json(run / "finals.json").items()}
    roles = {rank: final["role"] for rank, final in finals.items()}
    learner = next(f for f in finals.values() if f["role"] == "trainer")
    buffer = next(f for f in finals.values() if f["role"] == "buffer")
    queue = buffer["replay"]
    produced = sum(f["ledger"]["produced"] for f in finals.values() if f["role"] == "actor")
    assert learner["step"] == STEPS and learner["ledger"]["produced"] == 0  # a pure learner
    # each unroll served at most once: the learner used STEPS batches, and nothing was overwritten
    assert queue["sampler"] == "queue" and queue["evicted"] == 0
    assert STEPS * BATCH <= queue["sampled"] <= (STEPS + 1) * BATCH  # + the prefetched reply settled at the end
    dropped = buffer["ledger"]["dropped"]
    assert set(dropped) <= {"stale", "queue_full"} and buffer["ledger"]["expired"] == queue["stale"]
    assert produced == queue["admitted"] + dropped.get("stale", 0) - queue["stale"] + dropped.get("queue_full", 0)
    assert queue["admitted"] == queue["sampled"] + queue["stale"] + queue["size"]
    lags = {int(k): v for k, v in learner["staleness"].items()}
    assert sum(lags.values()) == STEPS * BATCH and max(lags) <= STALE
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    actors = {r for r, role in roles.items() if role == "actor"}
    returns = [row["episode_return"] for row in rows if row["rank"] in actors and "episode_return" in row]
    early, late = returns[: len(returns) // 4], returns[-len(returns) // 4 :]
    assert sum(late) / len(late) > 1.5 * sum(early) / len(early), returns  # random CartPole lasts ~22 steps
    learner_rows = [row for row in rows if row["rank"] == next(r for r, f in finals.items() if f["role"] == "trainer")]
    assert {"policy_loss", "value_loss", "entropy", "mean_rho"} <= set(learner_rows[-1])
    curve = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]["curve"]
    assert [point["learner_steps"] for point in curve] == [80, 160, 240]
    assert job.no_process_left()
