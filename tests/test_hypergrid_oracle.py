"""examples/hypergrid with a simulated slow reward (params.oracle_*): the same rewards, one oracle call
per sampled batch, pure-learner trainers beside actors, and a real 4-rank job.

The job runs under mpiexec with 1 trainer that only learns
(``params.trainer_samples=false``), 1 actor that samples and waits on the
oracle, 1 buffer and the coordinator: the actor's trajectories reach the
trainer only through replay, the actor reports its window L1, and the
ledger balances.
"""

from __future__ import annotations

import json

import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError
from tests.support.jobs import read_json
from tests.support.launching import REPO
from tests.support.scripts import load_script

EXAMPLE = REPO / "examples" / "hypergrid"


@pytest.fixture(scope="module")
def roles():
    load_script(EXAMPLE / "hypergrid_gfn.py", "hypergrid_gfn")
    return load_script(EXAMPLE / "roles.py", "hypergrid_roles_oracle")


def make(roles, cls, params: dict):
    torch.manual_seed(0)  # the model's initialisation
    config = Config.from_dict({"layout": {"trainers": 1, "actors": 1}, "params": params})
    role = cls(rank=0, config=config, generator=torch.Generator().manual_seed(0))
    role.setup()
    return role


def test_the_oracle_scores_each_batch_once_with_the_true_reward(roles):
    slow = make(roles, roles.HyperGridActor, {"oracle_latency_s": 0.001, "oracle_item_s": 0.0001})
    fast = make(roles, roles.HyperGridActor, {})
    a, b = slow.rollout(0), fast.rollout(0)
    assert torch.equal(a["terminal"], b["terminal"])  # same generator seed: the same trajectories
    assert torch.equal(a["log_rewards"], b["log_rewards"]) and a["log_rewards"].dtype == torch.float32
    assert torch.equal(a["log_rewards"], slow.env.log_reward(a["terminal"]).float())
    slow.rollout(0)
    assert slow.oracle.calls == 2 and slow.oracle.items == 2 * slow.n and fast.oracle.calls == 0
    assert 0 <= slow.metrics()["l1"] <= 2


def test_a_pure_learner_trainer_samples_nothing_and_reports_no_l1(roles):
    trainer = make(roles, roles.HyperGridTrainer, {"trainer_samples": False, "oracle_latency_s": 0.01})
    assert trainer.rollout(0) is None and trainer.oracle.calls == 0
    assert "l1" not in trainer.metrics()


@pytest.mark.parametrize("key", ["oracle_latency_s", "oracle_item_s", "oracle_item_cpu_s"])
def test_a_negative_or_nan_oracle_cost_names_the_key(roles, key):
    for bad in (-0.01, float("nan")):
        with pytest.raises(ConfigError) as err:
            make(roles, roles.HyperGridTrainer, {key: bad})
        assert err.value.key == f"params.{key}"


def test_bare_loop_waits_on_the_oracle_per_step():
    bare = load_script(EXAMPLE / "bare.py", "hypergrid_bare_oracle")
    args = bare.Args(n_steps=5, batch_size=4, log_every=0, window=16, exact_max_states=0, oracle_latency_s=0.02)
    metrics = bare.train(args)
    assert metrics["seconds"] >= 5 * 0.02  # every step waited once
    with pytest.raises(ConfigError) as err:
        bare.train(bare.Args(n_steps=1, log_every=0, window=4, oracle_latency_s=-1.0))
    assert err.value.key == "oracle_latency_s"


def test_actors_feed_a_pure_learner_through_replay_with_a_slow_oracle(local_job_factory):
    # on the local engine (ranks as threads of this process): the loops and the replay are under test
    steps = 40
    job = local_job_factory(
        "-n",
        "4",
        "layout.trainers=1",
        "layout.actors=1",
        f"run.steps={steps}",
        "run.log_every=5",
        "replay.replay_fraction=0",
        "replay.learner_batch=8",
        "replay.min_size_to_sample=16",
        "params.trainer_samples=false",
        "params.oracle_latency_s=0.005",
        "params.l1_window=200",
        "params.trajectories_per_step=8",
        config=EXAMPLE / "config.yaml",
    )
    assert job.wait(150) == 0, job.output
    run = job.run_dir()
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    finals = {int(rank): final for rank, final in read_json(run / "finals.json").items()}
    roles_of = {rank: final["role"] for rank, final in finals.items()}
    trainer = next(f for f in finals.values() if f["role"] == "trainer")
    actor = next(f for f in finals.values() if f["role"] == "actor")
    assert trainer["step"] == steps and trainer["ledger"]["produced"] == 0  # learned from replay only
    assert actor["ledger"]["produced"] > 0 and actor["ledger"]["produced"] % 8 == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    actor_rank = next(r for r, role in roles_of.items() if role == "actor")
    l1 = [row["l1"] for row in rows if row["rank"] == actor_rank]
    assert l1 and all(0 <= value <= 2 for value in l1)
    assert all("l1" not in row for row in rows if roles_of[row["rank"]] == "trainer")
    assert job.no_process_left()
