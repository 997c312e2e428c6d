"""examples/ppo_cartpole and examples/ppo_pendulum: DD-PPO end to end on real ranks, scaled down.

Each job runs under mpiexec -n 3 (2 trainers that roll out themselves and
average every minibatch's gradients, 1 coordinator) for a few updates: PPO's
named values reach metrics.jsonl and the report, the learning rate follows its
schedule, both trainers end with the same weights (checkpointed with the
schedule), and the policy learns something (CartPole's episode returns rise,
Pendulum's value loss falls), and the single-process baseline of the same config
and seed computes the same weights and evaluations. Reaching the targets is the benchmark's job
(benchmarks/onpolicy.py); one slow test runs CartPole to 475.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from tests.support.jobs import read_json
from tests.support.launching import REPO

CARTPOLE = REPO / "examples" / "ppo_cartpole"
PENDULUM = REPO / "examples" / "ppo_pendulum"
PPO_VALUES = {"loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm", "lr"}


def finished(job, timeout):
    assert job.wait(timeout) == 0, job.output
    run = job.run_dir()
    assert read_json(run / "ledger.json")["balanced"]
    finals = {int(rank): final for rank, final in read_json(run / "finals.json").items()}
    roles = {rank: final["role"] for rank, final in finals.items()}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return run, finals, roles, rows


def trainer_weights(run, ranks):
    [folder] = (run / "checkpoints").iterdir()
    states = [torch.load(folder / f"rank-{r:05d}.pt", weights_only=True)["role"] for r in ranks]
    return states


def check_ppo_job(run, finals, roles, rows, steps):
    trainers = sorted(r for r, role in roles.items() if role == "trainer")
    assert len(trainers) == 2 and all(finals[r]["step"] == steps for r in trainers)
    for rank in trainers:
        mine = [row for row in rows if row["rank"] == rank]
        assert mine and all(PPO_VALUES <= set(row) for row in mine), mine[0]
        assert all(0 <= row["clip_fraction"] <= 1 and row["entropy"] > -10 for row in mine)
        lrs = [row["lr"] for row in mine]
        assert lrs == sorted(lrs, reverse=True) and lrs[0] > lrs[-1]  # linear decay, stepped by the runtime
    report = read_json(run / "report.json")
    named = {m["name"] for m in report["metrics"]}
    assert PPO_VALUES <= named and "eval_return" in named
    first, second = trainer_weights(run, trainers)
    for key, value in first["model"].items():  # every minibatch averaged: the replicas never drift apart
        torch.testing.assert_close(value, second["model"][key], rtol=0, atol=1e-6)
    assert first["scheduler"]["last_epoch"] == steps
    return trainers


CARTPOLE_STEPS = 12
CARTPOLE_SMALL = [
    f"run.steps={CARTPOLE_STEPS}",
    "run.log_every=2",
    "sync.weights_to_coordinator_every=4",
    "params.envs=2",
    "params.unroll=128",
    "learner.batch_size=256",
    "params.eval_episodes=2",
    "params.target_return=100000",
]


def test_ppo_cartpole_job_averages_every_minibatch_and_learns(job_factory):
    job = job_factory(*CARTPOLE_SMALL, config=CARTPOLE / "config.yaml")
    run, finals, roles, rows = finished(job, 240)
    trainers = check_ppo_job(run, finals, roles, rows, CARTPOLE_STEPS)
    returns = [row["episode_return"] for row in rows if row["rank"] in trainers and "episode_return" in row]
    assert returns[-1] > returns[0] + 15, returns  # a random policy balances about 22 steps
    progress = [line for line in job.output.splitlines() if line.startswith("step ")]
    assert progress and all(f" {name} " in progress[-1] for name in ("policy_loss", "approx_kl", "clip_fraction"))
    curve = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]["curve"]
    assert [p["updates"] for p in curve] == [4, 8, 12]
    assert [p["env_steps"] for p in curve] == [u * 2 * 2 * 128 for u in (4, 8, 12)]
    # the single-process baseline of the same config and seed is the same computation (its docstring):
    # the same evaluations and, after 12 updates of 2 x 2 x 4 averaged minibatch steps, the same weights
    from gflowdist.config import Config

    single = load_single_process().train(Config.from_yaml(CARTPOLE / "config.yaml", CARTPOLE_SMALL), log=print)
    assert [p["eval_return"] for p in single["curve"]] == [p["eval_return"] for p in curve]
    assert single["env_steps"] == CARTPOLE_STEPS * 2 * 2 * 128  # both trainers' environments in one process
    first, _ = trainer_weights(run, trainers)
    for key, value in first["model"].items():
        assert torch.equal(value, single["model"][key]), key


PENDULUM_STEPS = 6
PENDULUM_SMALL = [
    f"run.steps={PENDULUM_STEPS}",
    "run.log_every=1",
    "sync.weights_to_coordinator_every=3",
    "params.envs=2",
    "params.unroll=200",
    "learner.batch_size=400",
    "learner.epochs=4",
    "params.eval_episodes=1",
    "params.lr_anneal=true",
]


def test_ppo_pendulum_job_runs_a_gaussian_policy_and_learns(job_factory):
    job = job_factory(*PENDULUM_SMALL, config=PENDULUM / "config.yaml")
    run, finals, roles, rows = finished(job, 240)
    trainers = check_ppo_job(run, finals, roles, rows, PENDULUM_STEPS)
    first, _ = trainer_weights(run, trainers)
    assert first["model"]["log_std"].shape == (1,)  # a Gaussian over Pendulum's one torque
    for rank in trainers:
        values = [row["value_loss"] for row in rows if row["rank"] == rank]
        assert values[-1] < 0.5 * values[0], values  # the critic learns the returns
    curve = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]["curve"]
    assert [p["updates"] for p in curve] == [3, 6] and all(-2000 < p["eval_return"] <= 0 for p in curve)


def load_single_process():
    spec = importlib.util.spec_from_file_location("ppo_single_process", CARTPOLE / "single_process.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_ppo_cartpole_reaches_475(job_factory):
    job = job_factory(config=CARTPOLE / "config.yaml")
    _, finals, _, _ = finished(job, 900)
    summary = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]
    assert summary["solved"] and summary["solved_at"]["eval_return"] >= 475
