"""Simulated slow work, for benchmarks and for sizing a layout: latency (waiting) and CPU cost.

This is a *simulation*. Nothing here talks to a simulator or a model; it
makes a fast function look like a slow one, so a layout can be tried
against the workload it will face:

- **latency**: time spent waiting (``time.sleep``), as for a remote
  simulator, a docking server or a language model behind an API. A waiting
  process leaves its core to others, so waits of many processes overlap.
- **CPU cost**: time spent computing (a busy loop on this process's CPU
  clock), as for a local simulator or a property model running here. It
  does not overlap beyond the cores there are.

:class:`SimulatedCost` holds one ``(latency_s, cpu_s)`` pair and pays it;
:class:`RewardOracle` wraps a batch reward function (a GFlowNet's reward, a
docking score) with a per-call latency plus a per-item wait and CPU cost.
The gymnasium wrapper is :class:`gflowdist.rl.slow_env.SlowEnv`.

Every value is checked where it is read: negative, NaN or infinite values
are a :class:`~gflowdist.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gflowdist.errors import ConfigError

__all__ = ["SimulatedCost", "RewardOracle", "seconds_param", "burn_cpu"]


def seconds_param(params: Mapping[str, Any], name: str, *, prefix: str = "params") -> float:
    """``params[name]`` as seconds >= 0 (absent: 0); anything else names ``prefix.name``."""
    value = params.get(name, 0.0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"must be a finite number of seconds >= 0, got {value!r}", key=f"{prefix}.{name}")
    return float(value)


def burn_cpu(seconds: float) -> None:
    """Compute (not wait) for ``seconds`` of this process's CPU time."""
    if seconds <= 0:
        return
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class SimulatedCost:
    """Pay ``latency_s`` of waiting and ``cpu_s`` of computing on each :meth:`pay`.

    ``keys`` names the two values in error messages (default
    ``params.latency_s`` / ``params.cpu_s``). :attr:`calls`,
    :attr:`waited_s` and :attr:`burned_s` count what was paid.
    """

    def __init__(self, latency_s: float = 0.0, cpu_s: float = 0.0, *, keys: tuple[str, str] | None = None):
        keys = keys or ("params.latency_s", "params.cpu_s")
        for value, key in ((latency_s, keys[0]), (cpu_s, keys[1])):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"must be a finite number of seconds >= 0, got {value!r}", key=key)
        self.latency_s, self.cpu_s = float(latency_s), float(cpu_s)
        self.calls = 0
        self.waited_s = 0.0
        self.burned_s = 0.0

    def pay(self, times: int = 1) -> None:
        """Wait ``times * latency_s``, then compute ``times * cpu_s``."""
        self.calls += times
        if self.latency_s:
            wait = times * self.latency_s
            time.sleep(wait)
            self.waited_s += wait
        if self.cpu_s:
            burn = times * self.cpu_s
            burn_cpu(burn)
            self.burned_s += burn

    def __bool__(self) -> bool:
        return bool(self.latency_s or self.cpu_s)

    def __repr__(self) -> str:
        return f"SimulatedCost(latency_s={self.latency_s}, cpu_s={self.cpu_s})"


class RewardOracle:
    """A batch reward function made slow: each call waits ``latency_s``, then ``item_s`` and computes
    ``item_cpu_s`` per item, then returns ``reward_fn(items)``.

    ``items`` is a tensor whose first dimension counts the items (a GFlowNet's
    terminal states); the oracle is called once per batch, as a docking or
    property model is. :meth:`from_params` reads ``params.oracle_latency_s``,
    ``params.oracle_item_s`` and ``params.oracle_item_cpu_s``. :attr:`calls`
    and :attr:`items` count the work done.
    """

    def __init__(
        self,
        reward_fn: Callable[[torch.Tensor], torch.Tensor],
        latency_s: float = 0.0,
        item_s: float = 0.0,
        item_cpu_s: float = 0.0,
        *,
        prefix: str = "params.oracle_",
    ):
        self.reward_fn = reward_fn
        self.call_cost = SimulatedCost(latency_s, 0.0, keys=(f"{prefix}latency_s", f"{prefix}latency_s"))
        self.item_cost = SimulatedCost(item_s, item_cpu_s, keys=(f"{prefix}item_s", f"{prefix}item_cpu_s"))
        self.calls = 0
        self.items = 0

    @classmethod
    def from_params(cls, reward_fn: Callable[[torch.Tensor], torch.Tensor], params: Mapping[str, Any]) -> RewardOracle:
        """The oracle of ``params.oracle_latency_s`` / ``oracle_item_s`` / ``oracle_item_cpu_s`` (each 0 if absent)."""
        return cls(
            reward_fn,
            seconds_param(params, "oracle_latency_s"),
            seconds_param(params, "oracle_item_s"),
            seconds_param(params, "oracle_item_cpu_s"),
        )

    @property
    def slow(self) -> bool:
        """Whether a call costs anything beyond ``reward_fn`` itself."""
        return bool(self.call_cost) or bool(self.item_cost)

    def __call__(self, items: torch.Tensor) -> torch.Tensor:
        count = int(items.shape[0]) if items.dim() else 1
        self.call_cost.pay()
        if count:
            self.item_cost.pay(count)
        self.calls += 1
        self.items += count
        return self.reward_fn(items)
