"""A gymnasium wrapper that makes each step slow: a simulated remote simulator (see gflowdist.simulation).

    env = SlowEnv(gymnasium.make("CartPole-v1"), latency_s=0.002, cpu_s=0.0)

Each :meth:`SlowEnv.step` (and, with ``on_reset``, each reset) first waits
``latency_s`` (``time.sleep``: the time a remote simulator takes, during
which this process leaves its core to others) and computes ``cpu_s`` (a
busy loop on this process's CPU clock: a local simulator's own work), then
steps the wrapped environment. Observations, rewards and episodes are the
wrapped environment's, unchanged: only time passes.

An environment actor (:class:`gflowdist.rl.EnvironmentActor`) wraps each of
its environments in it when ``params.env_latency_s`` or ``params.env_cpu_s``
is set; its vector environment steps them one after another, as one process
driving ``E`` simulators in turn does. This is a simulation, for benchmarks
(benchmarks/latency.py) and for sizing a layout against a slow simulator
before it exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium

from gflowdist.simulation import SimulatedCost, seconds_param

__all__ = ["SlowEnv", "slow_env_wrapper"]


class SlowEnv(gymnasium.Wrapper):
    """``env`` whose steps wait ``latency_s`` and compute ``cpu_s`` first (module docstring)."""

    def __init__(self, env: gymnasium.Env, latency_s: float = 0.0, cpu_s: float = 0.0, *, on_reset: bool = False):
        super().__init__(env)
        self.cost = SimulatedCost(latency_s, cpu_s, keys=("params.env_latency_s", "params.env_cpu_s"))
        self.on_reset = on_reset

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        self.cost.pay()
        return self.env.step(action)

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        if self.on_reset:
            self.cost.pay()
        return self.env.reset(**kwargs)


def slow_env_wrapper(params: Mapping[str, Any]) -> Any:
    """A ``wrappers`` entry for ``gymnasium.make_vec`` from ``params.env_latency_s`` / ``params.env_cpu_s``
    (None when both are 0 or absent); bad values are a ConfigError naming the key."""
    latency_s = seconds_param(params, "env_latency_s")
    cpu_s = seconds_param(params, "env_cpu_s")
    if not (latency_s or cpu_s):
        return None
    return lambda env: SlowEnv(env, latency_s, cpu_s)
