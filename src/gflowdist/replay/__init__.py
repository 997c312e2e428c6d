"""Replay buffers as composable parts: storage, sampler, writer, rate limiter.

- :class:`TensorStorage` holds items (dicts of fixed-shape tensors) in preallocated slots.
- A sampler picks slots: :class:`UniformSampler`, :class:`PrioritizedSampler`,
  :class:`FifoSampler`.
- A writer admits items and picks their slots: :class:`RoundRobinWriter`,
  :class:`KeepHighestWriter`, :class:`DedupWriter`.
- :mod:`gflowdist.replay.priorities`: item keys (slot + generation) for priority
  updates that skip overwritten items, and the :class:`BetaSchedule`.
- :class:`RateLimiter` keeps a minimum size and a samples-per-insert ratio (Reverb's rule).
- :class:`ReplayBuffer` composes them, keeps per-item metadata and offers presets
  (``ReplayBuffer.uniform``, ``.prioritized``, ``.fifo``, ``.keep_highest``, ``.dedup``,
  ``.from_config``).

Single-process and pure; a buffer-manager rank wraps it. See docs/replay.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Where each public name lives. Imported on first access (PEP 562), so that the config's checks can read
#: :mod:`gflowdist.replay.registry` without loading torch (``gflowdist layout`` stays light).
_HOMES = {
    "AdmitResult": "admission",
    "RateLimitedError": "admission",
    "ReplayBuffer": "buffer",
    "HashIndex": "key_index",
    "row_hash": "key_index",
    "BetaSchedule": "priorities",
    "RateLimiter": "rate_limiter",
    "wait_until": "rate_limiter",
    "FifoSampler": "samplers",
    "InsufficientItemsError": "samplers",
    "PrioritizedSampler": "samplers",
    "Sampler": "samplers",
    "UniformSampler": "samplers",
    "Batch": "storage",
    "ItemSchemaError": "storage",
    "TensorStorage": "storage",
    "batch_size": "storage",
    "DedupWriter": "writers",
    "KeepHighestWriter": "writers",
    "RoundRobinWriter": "writers",
    "Writer": "writers",
    "WriteResult": "writers",
}

if TYPE_CHECKING:
    from gflowdist.replay.admission import AdmitResult, RateLimitedError
    from gflowdist.replay.buffer import ReplayBuffer
    from gflowdist.replay.key_index import HashIndex, row_hash
    from gflowdist.replay.priorities import BetaSchedule
    from gflowdist.replay.rate_limiter import RateLimiter, wait_until
    from gflowdist.replay.samplers import (
        FifoSampler,
        InsufficientItemsError,
        PrioritizedSampler,
        Sampler,
        UniformSampler,
    )
    from gflowdist.replay.storage import Batch, ItemSchemaError, TensorStorage, batch_size
    from gflowdist.replay.writers import DedupWriter, KeepHighestWriter, RoundRobinWriter, Writer, WriteResult


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'gflowdist.replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gflowdist.replay.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AdmitResult",
    "Batch",
    "BetaSchedule",
    "DedupWriter",
    "FifoSampler",
    "HashIndex",
    "InsufficientItemsError",
    "ItemSchemaError",
    "KeepHighestWriter",
    "PrioritizedSampler",
    "RateLimitedError",
    "RateLimiter",
    "ReplayBuffer",
    "RoundRobinWriter",
    "Sampler",
    "TensorStorage",
    "UniformSampler",
    "WriteResult",
    "Writer",
    "batch_size",
    "row_hash",
    "wait_until",
]
