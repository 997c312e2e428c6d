"""What a replay buffer's checkpoint holds, and how it is restored: :meth:`ReplayBuffer.state_dict`'s format.

Only tensors and plain (msgpack-able) values, no pickle: the stored items
(the storage's live slots), their metadata (stamps and admission scores), the
sampler's, writer's and rate limiter's own states, the counters, and the
random generator's state, so a restored buffer draws the samples the original
would have drawn next. A checkpoint of another :data:`STATE_VERSION`, or one
that disagrees with the buffer on having a rate limiter, is refused naming the
setting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from gflowdist.errors import ConfigError
from gflowdist.replay.stamps import STAMPS

if TYPE_CHECKING:
    from gflowdist.replay.buffer import ReplayBuffer

__all__ = ["STATE_VERSION", "buffer_state", "load_buffer_state"]

STATE_VERSION = 1


def buffer_state(buffer: ReplayBuffer) -> dict[str, Any]:
    """``buffer``'s checkpoint (:meth:`ReplayBuffer.state_dict`)."""
    live = buffer.storage.live_indices()
    return {
        "version": STATE_VERSION,
        "storage": buffer.storage.state_dict(),
        "metadata": {name: values[live].clone() for name, values in buffer.metadata.items()},
        "sampler": buffer.sampler.state_dict(),
        "writer": buffer.writer.state_dict(),
        "rate_limiter": None if buffer.rate_limiter is None else buffer.rate_limiter.state_dict(),
        "counters": dict(buffer.counters),
        "generator": buffer.generator.get_state(),
    }


def load_buffer_state(buffer: ReplayBuffer, state: Mapping[str, Any]) -> None:
    """Restore ``state`` (:func:`buffer_state`) into ``buffer``, built the way the saved one was."""
    if state.get("version") != STATE_VERSION:
        raise ConfigError(
            f"replay checkpoint version {state.get('version')!r} is not the supported version {STATE_VERSION}",
            key="replay",
        )
    if (state["rate_limiter"] is None) != (buffer.rate_limiter is None):
        raise ConfigError("checkpoint and buffer disagree on having a rate limiter", key="replay.samples_per_insert")
    buffer.storage.load_state_dict(state["storage"])
    buffer.sampler.load_state_dict(state["sampler"])
    buffer.writer.load_state_dict(state["writer"])
    if buffer.rate_limiter is not None:
        buffer.rate_limiter.load_state_dict(state["rate_limiter"])
    live = buffer.storage.live_indices()
    saved = state["metadata"]
    buffer.stamps = torch.zeros(buffer.capacity, len(STAMPS), dtype=torch.int64)
    buffer.stamps[live] = torch.stack([saved[name].to(torch.int64) for name in STAMPS], 1)
    buffer.scores = torch.full((buffer.capacity,), math.nan, dtype=torch.float32)
    buffer.scores[live] = saved["score"].to(torch.float32)
    # counters added since (sample_calls, priority updates) start at 0 from older checkpoints
    buffer.counters = {name: int(state["counters"].get(name, 0)) for name in buffer.counters}
    buffer.generator.set_state(state["generator"])
