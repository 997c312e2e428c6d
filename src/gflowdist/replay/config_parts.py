"""The sampler and writer a replay config names (``replay.sampler``, ``replay.writer``).

:meth:`ReplayBuffer.from_config <gflowdist.replay.ReplayBuffer.from_config>`
builds its parts with these two functions; an unknown name raises a
``ConfigError`` naming the key and the choices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from gflowdist.errors import ConfigError
from gflowdist.replay.registry import build_part, part_spec
from gflowdist.replay.samplers import FifoSampler, PrioritizedSampler, QueueSampler, Sampler, UniformSampler
from gflowdist.replay.storage import Batch
from gflowdist.replay.writers import DedupWriter, KeepHighestWriter, RoundRobinWriter, Writer

__all__ = ["sampler_named", "writer_named"]


def sampler_named(
    name: str, *, alpha: float, beta: float, eps: float, beta_final: float | None, beta_steps: int
) -> Sampler:
    """``"uniform" | "prioritized" | "fifo" | "queue"``; the priority settings apply to prioritized."""
    samplers: dict[str, Callable[[], Sampler]] = {
        "uniform": UniformSampler,
        "prioritized": lambda: PrioritizedSampler(alpha, beta, eps, beta_final=beta_final, beta_steps=beta_steps),
        "fifo": FifoSampler,
        "queue": QueueSampler,
    }
    if name not in samplers:
        raise ConfigError(f"must be one of {sorted(samplers)}, found {name!r}", key="replay.sampler")
    return samplers[name]()


def writer_named(name: str | Mapping[str, Any], dedup_key: str | Callable[[Batch], torch.Tensor] | None) -> Writer:
    """``"round_robin" | "keep_highest" | "dedup"`` (which needs ``dedup_key``), or a mapping
    ``{name: ..., <options>}`` (:mod:`gflowdist.replay.registry`; dedup's ``key`` option, else ``dedup_key``)."""
    if isinstance(name, Mapping):
        spec = part_spec("writer", name, "replay.writer")
        if spec["name"] != "dedup":
            return cast(Writer, build_part("writer", spec))
        name, dedup_key = "dedup", spec["key"] if spec["key"] is not None else dedup_key
    if name == "dedup":
        if dedup_key is None:
            raise ConfigError(
                "writer 'dedup' needs a key: pass ReplayBuffer.from_config(cfg, dedup_key=<field or function>)",
                key="replay.writer",
            )
        return DedupWriter(dedup_key)
    if name == "round_robin":
        return RoundRobinWriter()
    if name == "keep_highest":
        return KeepHighestWriter()
    raise ConfigError(f"must be one of ['dedup', 'keep_highest', 'round_robin'], found {name!r}", key="replay.writer")
