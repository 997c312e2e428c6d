"""Simulated slow work (gflowdist.simulation, gflowdist.rl.slow_env): waits are waits, costs are CPU,
results are unchanged, and a bad latency or cost is a ConfigError naming its key.

Timing checks are bounds that hold under any load: ``time.sleep(d)`` never
returns before ``d`` of wall time, a waiting process accrues (almost) no CPU
time, and a busy loop on the CPU clock accrues at least what it was asked.
"""

from __future__ import annotations

import math
import time

import gymnasium
import numpy as np
import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError
from gflowdist.rl import EnvironmentActor
from gflowdist.rl.slow_env import SlowEnv, slow_env_wrapper
from gflowdist.simulation import RewardOracle, SimulatedCost, burn_cpu, seconds_param

BAD = [-0.001, float("nan"), float("inf"), True, "2ms"]


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def test_latency_is_waiting_not_computing():
    cost = SimulatedCost(latency_s=0.05)
    _, wall, cpu = timed(lambda: cost.pay(2))
    assert wall >= 0.1
    assert cpu < 0.05  # a sleeping process accrues no CPU time: far less than the 0.1 s waited
    assert cost.calls == 2 and cost.waited_s == pytest.approx(0.1) and cost.burned_s == 0


def test_cpu_cost_is_computing():
    _, wall, cpu = timed(lambda: burn_cpu(0.03))
    assert cpu >= 0.03 and wall >= 0.03
    cost = SimulatedCost(cpu_s=0.01)
    _, _, cpu = timed(lambda: cost.pay(3))
    assert cpu >= 0.03 and cost.burned_s == pytest.approx(0.03) and cost.waited_s == 0


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_latency_or_cost_names_its_key(bad):
    with pytest.raises(ConfigError) as err:
        SimulatedCost(latency_s=bad, keys=("params.env_latency_s", "params.env_cpu_s"))
    assert err.value.key == "params.env_latency_s"
    with pytest.raises(ConfigError) as err:
        SimulatedCost(cpu_s=bad, keys=("params.env_latency_s", "params.env_cpu_s"))
    assert err.value.key == "params.env_cpu_s"
    with pytest.raises(ConfigError) as err:
        seconds_param({"oracle_item_s": bad}, "oracle_item_s")
    assert err.value.key == "params.oracle_item_s" and "seconds >= 0" in str(err.value)


def test_absent_or_null_seconds_are_zero():
    assert seconds_param({}, "env_latency_s") == 0.0
    assert seconds_param({"env_latency_s": None}, "env_latency_s") == 0.0
    assert seconds_param({"env_latency_s": 2}, "env_latency_s") == 2.0
    assert slow_env_wrapper({}) is None and not SimulatedCost()


def test_slow_env_steps_the_same_episodes_and_waits_each_step():
    plain = gymnasium.make("CartPole-v1")
    slow = SlowEnv(gymnasium.make("CartPole-v1"), latency_s=0.01)
    a, _ = plain.reset(seed=3)
    b, _ = slow.reset(seed=3)
    assert np.array_equal(a, b) and slow.cost.calls == 0  # resets are free unless on_reset
    began = time.perf_counter()
    for step in range(5):
        a = plain.step(step % 2)
        b = slow.step(step % 2)
        assert all(np.array_equal(x, y) for x, y in zip(a[:4], b[:4], strict=True))
    assert time.perf_counter() - began >= 0.05 and slow.cost.calls == 5


def test_slow_env_on_reset_pays_too():
    env = SlowEnv(gymnasium.make("CartPole-v1"), latency_s=0.001, on_reset=True)
    env.reset(seed=0)
    assert env.cost.calls == 1


def actor_with(params: list[str]) -> EnvironmentActor:
    config = Config.from_dict(
        {
            "layout": {"trainers": 1, "actors": 1},
            "params": {"env_id": "CartPole-v1", "envs_per_actor": 2, "rollout_steps": 3},
        }
    ).apply_overrides(params)

    class Greedy(EnvironmentActor):
        def act(self, obs, epsilon):
            return torch.zeros(obs.shape[0], dtype=torch.int64)

    actor = Greedy(rank=0, config=config, generator=torch.Generator().manual_seed(0))
    actor.setup()
    return actor


def test_an_environment_actor_waits_per_environment_step():
    actor = actor_with(["params.env_latency_s=0.01"])
    began = time.perf_counter()
    batch = actor.collect()
    # 3 vector steps of 2 environments stepped one after the other: 6 waits of 10 ms
    assert time.perf_counter() - began >= 0.06
    assert actor.env_steps == 6 and batch["action"].numel() == 6
    fast = actor_with([])
    assert not any(isinstance(env, SlowEnv) for env in fast.env.envs)
    assert all(isinstance(env, SlowEnv) for env in actor.env.envs)
    assert actor.metrics()["env_wait_s"] == pytest.approx(0.06) and "env_wait_s" not in fast.metrics()


@pytest.mark.parametrize("key", ["env_latency_s", "env_cpu_s"])
def test_an_environment_actor_refuses_a_negative_latency_naming_the_key(key):
    with pytest.raises(ConfigError) as err:
        actor_with([f"params.{key}=-1"])
    assert err.value.key == f"params.{key}"


def test_reward_oracle_waits_once_per_call_and_per_item():
    calls = []

    def reward(x):
        calls.append(x.shape[0])
        return x.double().sum(-1)

    oracle = RewardOracle(reward, latency_s=0.02, item_s=0.001)
    items = torch.arange(12).view(6, 2)
    out, wall, cpu = timed(lambda: oracle(items))
    assert torch.equal(out, items.double().sum(-1))  # the reward itself, unchanged
    assert wall >= 0.02 + 6 * 0.001 and cpu < 0.02
    assert calls == [6] and oracle.calls == 1 and oracle.items == 6
    assert oracle.slow and not RewardOracle(reward).slow


def test_reward_oracle_from_params_names_the_bad_key():
    assert RewardOracle.from_params(lambda x: x, {"oracle_latency_s": 0.01}).call_cost.latency_s == 0.01
    for key in ("oracle_latency_s", "oracle_item_s", "oracle_item_cpu_s"):
        with pytest.raises(ConfigError) as err:
            RewardOracle.from_params(lambda x: x, {key: math.nan})
        assert err.value.key == f"params.{key}"
