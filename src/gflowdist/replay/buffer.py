"""The replay buffer: a storage, a sampler, a writer and an optional rate limiter.

::

    buffer = ReplayBuffer.prioritized(capacity=10_000, alpha=0.6, beta=0.4)
    result = buffer.extend(batch, producer=3, seq=first_seq, policy_version=v,
                           scores=batch["log_reward"])
    batch, info = buffer.sample(64, step=learner_step)
    buffer.update_priorities(info["keys"], td_errors.abs())   # stale keys are skipped, counted

Besides the item data the buffer keeps, per slot, in parallel tensors: the
producer rank, the sequence number and the policy version the producer
stamped (int64), the admission score (float32, NaN when none was given) and
the insertion step (int64: how many items were admitted before this one).
:meth:`ReplayBuffer.sample` returns them for the sampled items in ``info``,
with each item's key (slot and insertion step in one int64, see
:mod:`gflowdist.replay.priorities`) for later priority updates.

The buffer itself never blocks: :meth:`extend` and :meth:`sample` raise
:class:`RateLimitedError` when the rate limiter forbids the call. A caller
(the buffer-manager rank) asks :meth:`can_insert` / :meth:`can_sample`, or
waits with :meth:`wait_until_can_sample`, which makes progress through a
callable and raises ``DeadlineError`` at its deadline (inserts wait on
``buffer.rate_limiter.wait_until_can_insert``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch

from gflowdist.replay.admission import AdmitResult, RateLimitedError
from gflowdist.replay.buffer_state import buffer_state, load_buffer_state
from gflowdist.replay.config_parts import sampler_named, writer_named
from gflowdist.replay.priorities import check_priorities, current_keys, item_keys
from gflowdist.replay.rate_limiter import RateLimiter, wait_until
from gflowdist.replay.registry import build_part, part_spec
from gflowdist.replay.samplers import FifoSampler, PrioritizedSampler, QueueSampler, Sampler, UniformSampler
from gflowdist.replay.stamps import STAMPS, ItemStamps, stamp_rows
from gflowdist.replay.storage import Batch, TensorStorage
from gflowdist.replay.writers import (
    REJECTED_DUPLICATE,
    REJECTED_LOW_SCORE,
    DedupWriter,
    KeepHighestWriter,
    RoundRobinWriter,
    Writer,
    WriteResult,
)

__all__ = ["AdmitResult", "RateLimitedError", "ReplayBuffer"]


class ReplayBuffer:
    """Composes a storage, a sampler, a writer and an optional rate limiter.

    Args:
        storage: where items live (its capacity is the buffer's).
        sampler: which items come out.
        writer: which items are admitted, and where they go.
        rate_limiter: when inserting/sampling may proceed; ``None`` = always.
        generator: the random stream of :meth:`sample`; by default a new
            generator seeded with ``torch.initial_seed()``.
    """

    def __init__(
        self,
        storage: TensorStorage,
        sampler: Sampler,
        writer: Writer,
        rate_limiter: RateLimiter | None = None,
        generator: torch.Generator | None = None,
    ):
        self.storage = storage
        self.sampler = sampler
        self.writer = writer
        self.rate_limiter = rate_limiter
        if generator is None:
            generator = torch.Generator()
            generator.manual_seed(torch.initial_seed())
        self.generator = generator
        self.stamps = torch.zeros(storage.capacity, len(STAMPS), dtype=torch.int64)
        self.scores = torch.full((storage.capacity,), math.nan, dtype=torch.float32)
        sampler.items = ItemStamps(lambda: self.stamps, lambda: self.storage.live)
        self.counters = {
            "offered": 0,
            "admitted": 0,
            "rejected_duplicate": 0,
            "rejected_low_score": 0,
            "evicted": 0,
            "sampled": 0,
            "consumed": 0,
            "sample_calls": 0,
            "initial_priorities": 0,
            "priority_updates": 0,
            "stale_priority_updates": 0,
            "stale": 0,
        }

    # -- presets --------------------------------------------------------------

    @classmethod
    def uniform(
        cls, capacity: int, *, rate_limiter: RateLimiter | None = None, generator: torch.Generator | None = None
    ) -> ReplayBuffer:
        """Uniform sampling with replacement; the oldest item is overwritten when full."""
        return cls(TensorStorage(capacity), UniformSampler(), RoundRobinWriter(), rate_limiter, generator)

    @classmethod
    def prioritized(
        cls,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        *,
        eps: float = 1e-6,
        beta_final: float | None = None,
        beta_steps: int = 0,
        rate_limiter: RateLimiter | None = None,
        generator: torch.Generator | None = None,
    ) -> ReplayBuffer:
        """Proportional prioritized sampling; the oldest item is overwritten when full.

        Beta anneals from ``beta`` to ``beta_final`` over ``beta_steps`` steps
        (the ``step`` of :meth:`sample`) when ``beta_final`` is given.
        """
        return cls(
            TensorStorage(capacity),
            PrioritizedSampler(alpha, beta, eps, beta_final=beta_final, beta_steps=beta_steps),
            RoundRobinWriter(),
            rate_limiter,
            generator,
        )

    @classmethod
    def fifo(
        cls, capacity: int, *, rate_limiter: RateLimiter | None = None, generator: torch.Generator | None = None
    ) -> ReplayBuffer:
        """A queue: each item is served once, oldest first; when full the oldest
        unserved item is overwritten (counted as evicted)."""
        return cls(TensorStorage(capacity), FifoSampler(), RoundRobinWriter(), rate_limiter, generator)

    @classmethod
    def keep_highest(
        cls, capacity: int, *, rate_limiter: RateLimiter | None = None, generator: torch.Generator | None = None
    ) -> ReplayBuffer:
        """Keeps the ``capacity`` highest-scoring items offered; samples them uniformly."""
        return cls(TensorStorage(capacity), UniformSampler(), KeepHighestWriter(), rate_limiter, generator)

    @classmethod
    def dedup(
        cls,
        capacity: int,
        key: str | Callable[[Batch], torch.Tensor],
        *,
        rate_limiter: RateLimiter | None = None,
        generator: torch.Generator | None = None,
    ) -> ReplayBuffer:
        """Refuses items whose ``key`` is already stored; round robin; uniform sampling."""
        return cls(TensorStorage(capacity), UniformSampler(), DedupWriter(key), rate_limiter, generator)

    @classmethod
    def queue(
        cls, capacity: int, *, rate_limiter: RateLimiter | None = None, generator: torch.Generator | None = None
    ) -> ReplayBuffer:
        """The on-policy queue: each item served once, oldest first; a full queue takes nothing more
        (:meth:`has_room`; the buffer rank parks what does not fit) and :meth:`drop_stale` drops items
        whose policy lag is too large."""
        return cls(TensorStorage(capacity), QueueSampler(), RoundRobinWriter(), rate_limiter, generator)

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        *,
        dedup_key: str | Callable[[Batch], torch.Tensor] | None = None,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        beta_final: float | None = None,
        beta_steps: int = 0,
        generator: torch.Generator | None = None,
    ) -> ReplayBuffer:
        """Build from an object with attributes ``capacity``, ``sampler``, ``writer``,
        ``min_size_to_sample``, ``samples_per_insert`` and ``tolerance`` (e.g. ``gflowdist.config``
        ``ReplayConfig``).

        ``sampler`` and ``writer`` are names or mappings ``{name: ..., <options>}``
        (:mod:`gflowdist.replay.registry`); a mapping carries its own options. For a
        sampler given by name only, ``alpha``, ``beta``, ``eps``, ``beta_final`` and
        ``beta_steps`` apply to ``"prioritized"``; ``dedup_key`` is the key of writer
        ``"dedup"`` when its mapping names none (a field name or a function of the batch).
        """
        if isinstance(cfg.sampler, str):
            sampler = sampler_named(
                cfg.sampler, alpha=alpha, beta=beta, eps=eps, beta_final=beta_final, beta_steps=beta_steps
            )
        else:
            sampler = build_part("sampler", part_spec("sampler", cfg.sampler, "replay.sampler"))
        writer = writer_named(cfg.writer, dedup_key)
        limiter = RateLimiter(cfg.min_size_to_sample, cfg.samples_per_insert, cfg.tolerance)
        return cls(TensorStorage(cfg.capacity), sampler, writer, limiter, generator)

    # -- inserting ------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.storage)

    @property
    def metadata(self) -> dict[str, torch.Tensor]:
        """Per-slot metadata as views: ``producer``, ``seq``, ``policy_version``,
        ``insert_step`` (int64) and ``score`` (float32). Free slots hold stale values."""
        return {**{name: self.stamps[:, column] for column, name in enumerate(STAMPS)}, "score": self.scores}

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def can_insert(self, n: int) -> bool:
        return self.rate_limiter is None or self.rate_limiter.can_insert(n)

    def has_room(self, n: int) -> bool:
        """Whether ``n`` more items fit without overwriting a stored one (what a queue waits for)."""
        return len(self.storage) + n <= self.capacity

    def drop_stale(self, version: int, max_staleness: int) -> int:
        """Free every stored item whose policy lag ``version - policy_version`` exceeds ``max_staleness``;
        returns how many (counted in ``counters["stale"]``; the sampler hears of them via ``on_free``)."""
        live = self.storage.live_indices()
        stale = live[version - self.stamps[live, 2] > max_staleness]
        if not stale.numel():
            return 0
        freed = self.storage.free(stale)
        self.sampler.on_free(stale)
        self.counters["stale"] += freed
        if self.rate_limiter is not None:
            self.rate_limiter.record_delete(freed)
        return freed

    def extend(
        self,
        batch: Mapping[str, torch.Tensor],
        *,
        producer: int | torch.Tensor,
        seq: int | torch.Tensor,
        policy_version: int | torch.Tensor,
        scores: torch.Tensor | None = None,
        priorities: torch.Tensor | None = None,
    ) -> AdmitResult:
        """Offer a batch of ``B`` items; returns what was admitted, rejected, evicted.

        ``producer`` and ``policy_version`` are an int for the whole batch or a
        tensor of ``B``; ``seq`` is a tensor of ``B`` sequence numbers or an
        int, the first of ``B`` consecutive ones. ``scores`` (``B`` floats) are
        required by the keep-highest writer and stored as metadata.
        ``priorities`` (``B`` finite floats ``>= 0``, prioritized sampler only)
        are the items' initial priorities, e.g. an Ape-X actor's TD errors;
        without them a new item gets the largest priority seen so far.
        """
        size = self.storage.check_schema(batch)
        if size == 0:
            empty = torch.zeros(0, dtype=torch.int64)
            return AdmitResult(0, 0, 0, 0, 0, empty, empty.bool())
        rows = stamp_rows(size, producer, seq, policy_version)
        if scores is not None:
            scores = torch.as_tensor(scores).flatten()
            if scores.numel() != size:
                raise ValueError(f"scores has {scores.numel()} entries for a batch of {size}")
            scores = scores.to(torch.float32)
        if priorities is not None:
            if not self.sampler.prioritized:
                raise TypeError(
                    f"the {self.sampler.name} sampler has no priorities: initial priorities need sampler 'prioritized'"
                )
            priorities = check_priorities(priorities, size)
        limiter = self.rate_limiter
        if limiter is not None and not limiter.can_insert(size):
            raise RateLimitedError(
                f"inserting {size} items now breaks the rate limit: {limiter.why_insert_blocked(size)}"
            )
        result = self.writer.extend(self.storage, batch, scores)
        self._stamp(result, rows, scores, priorities)
        return self._count_admission(size, result)

    def _stamp(
        self, result: WriteResult, rows: torch.Tensor, scores: torch.Tensor | None, priorities: torch.Tensor | None
    ) -> None:
        """Write the metadata of the stored items of ``result`` and tell the sampler."""
        size = rows.shape[0]
        admitted = int(result.admitted.sum())
        # insertion step of item k = number of items admitted before it (in batch order)
        first_step = self.counters["admitted"]
        if admitted == size:
            rows[:, 3] = torch.arange(first_step, first_step + size)
        else:
            rows[:, 3] = torch.cumsum(result.admitted, 0) + (first_step - 1)
        stored: torch.Tensor | slice
        if admitted == size <= self.capacity:  # every item stored, in batch order
            slots, stored = result.indices, slice(None)
        else:
            stored = torch.nonzero(result.indices >= 0).flatten()
            slots = result.indices[stored]
        self.stamps[slots] = rows[stored]
        if scores is None:
            self.scores.index_fill_(0, slots, math.nan)
        else:
            self.scores[slots] = scores[stored]
        self.sampler.on_write(slots, None if priorities is None else priorities[stored])
        if priorities is not None:
            self.counters["initial_priorities"] += int(slots.numel())

    def _count_admission(self, size: int, result: WriteResult) -> AdmitResult:
        admitted = int(result.admitted.sum())
        counts = AdmitResult(
            size,
            admitted,
            result.rejected.get(REJECTED_DUPLICATE, 0),
            result.rejected.get(REJECTED_LOW_SCORE, 0),
            result.evicted,
            result.indices,
            result.admitted,
        )
        counters = self.counters
        counters["offered"] += size
        counters["admitted"] += admitted
        counters["rejected_duplicate"] += counts.rejected_duplicate
        counters["rejected_low_score"] += counts.rejected_low_score
        counters["evicted"] += result.evicted
        if self.rate_limiter is not None:
            self.rate_limiter.record_insert(admitted)
            self.rate_limiter.record_delete(result.evicted)
        return counts

    # -- sampling -------------------------------------------------------------

    def can_sample(self, n: int) -> bool:
        """Whether :meth:`sample` of ``n`` would succeed now (sampler and rate limiter)."""
        return self.sampler.can_sample(len(self.storage), n) and (
            self.rate_limiter is None or self.rate_limiter.can_sample(n)
        )

    def wait_until_can_sample(
        self, n: int, *, timeout: float, progress: Callable[[], object] | None = None, poll_interval: float = 0.001
    ) -> None:
        """Call ``progress`` until :meth:`can_sample`; ``DeadlineError`` after ``timeout`` s."""
        wait_until(
            lambda: self.can_sample(n),
            what=f"sample {n} items",
            timeout=timeout,
            progress=progress,
            poll_interval=poll_interval,
            why_blocked=lambda: self._why_sample_blocked(n),
        )

    def _why_sample_blocked(self, n: int) -> str:
        if not self.sampler.can_sample(len(self.storage), n):
            return f"the {self.sampler.name} sampler cannot serve {n} items from {len(self.storage)} stored"
        if self.rate_limiter is None:
            return "nothing blocks it now (no rate limiter, and the sampler can serve it)"
        return self.rate_limiter.why_sample_blocked(n)

    def sample(self, n: int, *, step: int | None = None) -> tuple[Batch, dict[str, torch.Tensor]]:
        """Draw ``n`` items; returns ``(batch, info)``.

        ``info`` holds ``indices`` (slots), ``keys`` (int64 item keys for
        :meth:`update_priorities`), ``weights`` (importance weights, float32)
        and the metadata of each sampled item: ``producer``, ``seq``,
        ``policy_version``, ``score``, ``insert_step``. ``step`` (e.g. the
        learner's step) is where an annealing beta stands; by default the
        number of earlier :meth:`sample` calls.
        """
        if self.rate_limiter is not None and not self.rate_limiter.can_sample(n):
            raise RateLimitedError(
                f"sampling {n} items now breaks the rate limit: {self.rate_limiter.why_sample_blocked(n)}"
            )
        if step is None:
            step = self.counters["sample_calls"]
        indices, info = self.sampler.sample(len(self.storage), n, self.generator, step)
        batch = self.storage.get(indices)
        rows = self.stamps[indices]
        info = {
            "indices": indices,
            "keys": item_keys(indices, rows[:, 3], self.capacity),
            "weights": info.get("weights", torch.ones(n, dtype=torch.float32)),
            **{name: rows[:, column] for column, name in enumerate(STAMPS)},
            "score": self.scores[indices],
        }
        self.counters["sampled"] += n
        self.counters["sample_calls"] += 1
        if self.rate_limiter is not None:
            self.rate_limiter.record_sample(n)
        if self.sampler.consumes:
            consumed = self.storage.free(indices)
            self.counters["consumed"] += consumed
            if self.rate_limiter is not None:
                self.rate_limiter.record_delete(consumed)
        return batch, info

    def update_priorities(self, keys: torch.Tensor, priorities: torch.Tensor) -> int:
        """Set new priorities of sampled items named by their ``info["keys"]``.

        An update applies only while the item is still stored: a key whose
        slot was overwritten or freed since it was sampled (a late update from
        a remote learner) is skipped and counted in
        ``counters["stale_priority_updates"]``. Returns how many were applied.
        """
        if not self.sampler.prioritized:
            raise TypeError(f"the {self.sampler.name} sampler has no priorities to update")
        keys = torch.as_tensor(keys, dtype=torch.int64).flatten()
        priorities = check_priorities(priorities, keys.numel())
        current, slots = current_keys(keys, self.capacity, self.storage.live, self.stamps[:, 3])
        # a sampler that says it is prioritized has PrioritizedSampler's update_priorities (checked above)
        cast(PrioritizedSampler, self.sampler).update_priorities(slots[current], priorities[current])
        applied = int(current.sum())
        self.counters["priority_updates"] += applied
        self.counters["stale_priority_updates"] += keys.numel() - applied
        return applied

    # -- reporting and checkpoints -------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Plain numbers: size, capacity, the admission/sampling counters, the limiter's."""
        stats: dict[str, Any] = {
            "size": len(self),
            "capacity": self.capacity,
            "sampler": self.sampler.name,
            "writer": self.writer.name,
            **self.counters,
        }
        if self.rate_limiter is not None:
            stats["rate_limiter"] = self.rate_limiter.stats()
        return stats

    def state_dict(self) -> dict[str, Any]:
        """Only tensors and plain (msgpack-able) values: no pickle needed to save it.

        Includes the generator state, so a restored buffer draws the same
        samples the original would have drawn next (:mod:`gflowdist.replay.buffer_state`).
        """
        return buffer_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` into a buffer built the same way."""
        load_buffer_state(self, state)
