"""Which stored items come out: uniform, prioritized, first-in first-out.

A sampler sees slots, never item data. The buffer tells it which slots were
(over)written, in insertion order, through :meth:`Sampler.on_write`, and asks
for ``n`` slots with :meth:`Sampler.sample`::

    indices, info = sampler.sample(storage_len, n, generator)

Non-consuming samplers (uniform, prioritized) draw with replacement from the
slots ``[0, storage_len)``; the writers fill slots from 0 upwards, so without
consumption those are exactly the live slots. A consuming sampler (FIFO)
serves each item once: the buffer frees the returned slots in the storage.

``info["weights"]`` (float32, one per sampled item) are importance weights; a
sampler that leaves them out means all ones. ``step`` is the caller's training
step: the learner step (policy version) that will use the batch; a prioritized
sampler anneals beta with it, a staleness-aware one compares it with the items'
versions.

Besides slots, a sampler sees each stored item's stamps through ``self.items``
(an :class:`~gflowdist.replay.stamps.ItemStamps` the buffer sets: policy
version, producer rank, admission order; read-only copies), so a sampler that
prefers fresh items is a few lines::

    class FreshestFirst(Sampler):          # consumes: the n items of newest policy version
        name, consumes = "freshest_first", True
        def can_sample(self, storage_len, n):
            return storage_len >= n
        def sample(self, storage_len, n, generator, step=0):
            slots = self.items.live()
            newest = torch.argsort(self.items.policy_version(slots), descending=True, stable=True)
            return slots[newest[:n]], {}

A consuming sampler is told of slots the buffer freed without serving them
(items dropped as too stale) through :meth:`Sampler.on_free`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.replay.component import Component
from gflowdist.replay.priorities import BetaSchedule, check_priorities
from gflowdist.replay.stamps import ItemStamps

__all__ = [
    "FifoSampler",
    "QueueSampler",
    "InsufficientItemsError",
    "PrioritizedSampler",
    "Sampler",
    "UniformSampler",
]


class InsufficientItemsError(GflowdistError, LookupError):
    """A sample asked for more items than the buffer can serve (empty, or too few unserved)."""


def _grown(tensor: torch.Tensor, size: int, fill: float | int | bool) -> torch.Tensor:
    """``tensor`` extended with ``fill`` to at least ``size`` entries (doubling)."""
    if tensor.numel() >= size:
        return tensor
    new = torch.full((max(size, 2 * tensor.numel()),), fill, dtype=tensor.dtype)
    new[: tensor.numel()] = tensor
    return new


class Sampler(Component):
    """Base class: the protocol every sampler follows.

    Attributes:
        name: the config spelling (``"uniform"``, ``"prioritized"``, ``"fifo"``).
        consumes: True when a sampled item is served once and then removed.
        prioritized: True when items have priorities (initial ones on write, updates).
    """

    kind = "sampler"
    name = "sampler"
    consumes = False
    prioritized = False
    #: True for a queue: producers are held back when it is full instead of old items being overwritten
    backpressure = False
    #: the stored items' stamps (read-only copies); set by the buffer that owns the sampler
    items: ItemStamps | None = None

    def on_free(self, indices: torch.Tensor) -> None:
        """Slots ``indices`` were freed by the buffer without being served (e.g. items too stale)."""

    def on_write(self, indices: torch.Tensor, priorities: torch.Tensor | None = None) -> None:
        """Slots ``indices`` (distinct, in insertion order) now hold new items.

        ``priorities`` (one per slot, checked by the caller) are the producer's
        initial priorities; only a prioritized sampler accepts them.
        """
        if priorities is not None:
            raise TypeError(f"the {self.name} sampler has no priorities: initial priorities need sampler 'prioritized'")

    def can_sample(self, storage_len: int, n: int) -> bool:
        """Whether :meth:`sample` of ``n`` would succeed now."""
        return storage_len > 0

    def sample(
        self, storage_len: int, n: int, generator: torch.Generator, step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def _check_request(self, storage_len: int, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"the number of items to sample must be a positive int, got {n!r}")
        if storage_len <= 0:
            raise InsufficientItemsError(f"cannot sample {n} items from an empty buffer")


class UniformSampler(Sampler):
    """Each of the ``N = storage_len`` items with probability ``1/N``, with replacement."""

    name = "uniform"

    def sample(
        self, storage_len: int, n: int, generator: torch.Generator, step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self._check_request(storage_len, n)
        return torch.randint(0, storage_len, (n,), generator=generator), {}


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay (Schaul et al. 2016), with replacement.

    Each slot ``i`` has a priority ``p_i > 0``. A new item gets the
    priority its producer supplied (``on_write(slots, priorities)``, e.g.
    Ape-X actors' own TD errors), else the largest priority seen so far
    (``1.0`` before any), so it is likely to be seen at least once. Supplied
    and updated priorities are stored as ``p_i = priority_i + eps``. Over the
    ``N = storage_len`` items::

        P(i) = p_i**alpha / sum_k p_k**alpha
        w_i  = (N * P(i))**(-beta) / max_j (N * P(j))**(-beta)
             = (p_i**alpha / min_j p_j**alpha)**(-beta)

    ``w_i`` is in ``info["weights"]``; the max runs over all stored items (not
    just the batch), so weights are comparable across batches and ``<= 1``.
    ``alpha = 0`` is uniform sampling; ``beta = 1`` fully corrects the bias.
    Beta follows a :class:`~gflowdist.replay.priorities.BetaSchedule`: it
    anneals linearly from ``beta`` to ``beta_final`` over ``beta_steps``
    steps (the ``step`` passed to :meth:`sample`); without ``beta_final``
    it stays ``beta``.

    The sampler stores ``p_i**alpha`` (attribute ``scaled``, float64). A draw
    is inverse-CDF sampling on its cumulative sum: ``O(N)`` to rebuild the
    sum after priorities changed, then ``O(n log N)`` for ``n`` draws;
    vectorised, and deterministic for a given generator state.
    """

    name = "prioritized"
    prioritized = True

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        *,
        beta_final: float | None = None,
        beta_steps: int = 0,
    ):
        if isinstance(alpha, bool) or not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
            raise ConfigError(f"must be a finite number >= 0, got {alpha!r}", key="replay.priority_alpha")
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise ConfigError(
                f"must be > 0, got {eps!r}: with eps = 0 an item updated to priority 0 "
                f"is never sampled again and the weight normaliser (N * P_min)**-beta "
                f"is infinite",
                key="replay.eps",
            )
        self.schedule = BetaSchedule(beta, beta_final, beta_steps)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.eps = float(eps)
        self.scaled = torch.zeros(0, dtype=torch.float64)
        self.max_priority = 1.0
        self._cdf: torch.Tensor | None = None  # cumulative sum of scaled[:len(_cdf)]
        self._scaled_min = 1.0

    def on_write(self, indices: torch.Tensor, priorities: torch.Tensor | None = None) -> None:
        if not indices.numel():
            return
        self.scaled = _grown(self.scaled, int(indices.max()) + 1, 0.0)
        if priorities is None:
            self.scaled[indices] = self.max_priority**self.alpha
        else:
            self._store(indices, check_priorities(priorities, indices.numel()))
        self._cdf = None

    def update_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Set ``p_i = priorities_k + eps`` for ``i = indices[k]``.

        Priorities must be finite and ``>= 0`` (pass ``|TD error|`` or a loss).
        If an index repeats, one of its values is kept (which one is unspecified).
        Slots are not checked for holding the item the caller meant:
        :meth:`ReplayBuffer.update_priorities` does that with item keys.
        """
        indices = torch.as_tensor(indices, dtype=torch.int64).flatten()
        priorities = check_priorities(priorities, indices.numel())
        if priorities.numel() == 0:
            return
        if int(indices.min()) < 0 or int(indices.max()) >= self.scaled.numel():
            raise IndexError(
                f"priority update for a slot that was never written: "
                f"range [{int(indices.min())}, {int(indices.max())}], "
                f"written slots [0, {self.scaled.numel()})"
            )
        self._store(indices, priorities)
        self._cdf = None

    def _store(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        stored = priorities + self.eps
        self.scaled[indices] = stored**self.alpha
        self.max_priority = max(self.max_priority, float(stored.max()))

    def probabilities(self, storage_len: int) -> torch.Tensor:
        """``P(i)`` for the slots ``[0, storage_len)`` (float64)."""
        scaled = self.scaled[:storage_len]
        return scaled / scaled.sum()

    def sample(
        self, storage_len: int, n: int, generator: torch.Generator, step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self._check_request(storage_len, n)
        if self._cdf is None or self._cdf.numel() != storage_len:
            self._cdf = torch.cumsum(self.scaled[:storage_len], 0)
            self._scaled_min = float(self.scaled[:storage_len].min())
        draws = torch.rand(n, generator=generator, dtype=torch.float64) * self._cdf[-1]
        indices = torch.searchsorted(self._cdf, draws, right=True).clamp_(max=storage_len - 1)
        beta = self.schedule.value(step)
        weights = (self.scaled[indices] / self._scaled_min) ** (-beta)
        return indices, {"weights": weights.to(torch.float32)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "scaled": self.scaled.clone(),
            "max_priority": self.max_priority,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if state["alpha"] != self.alpha:
            raise ConfigError(
                f"checkpoint priorities are stored raised to alpha {state['alpha']}, this sampler uses {self.alpha}",
                key="replay.priority_alpha",
            )
        self.scaled = state["scaled"].to(torch.float64).clone()
        self.max_priority = float(state["max_priority"])
        self._cdf = None


class FifoSampler(Sampler):
    """Oldest unserved item first; each item is served once (the sampler consumes).

    Every written slot gets an insertion ordinal ``t`` (0, 1, 2, ... over the
    sampler's lifetime) and is *pending*. ``sample(n)`` returns the ``n``
    pending slots of smallest ``t``, oldest first, and clears their pending
    flag; the buffer frees them in the storage. Asking for more than the
    pending count raises :class:`InsufficientItemsError`. An overwritten
    pending slot (the writer evicted it) simply takes the new item's ordinal.
    """

    name = "fifo"
    consumes = True

    def __init__(self) -> None:
        self.order = torch.zeros(0, dtype=torch.int64)
        self.pending = torch.zeros(0, dtype=torch.bool)
        self.next_order = 0

    def on_write(self, indices: torch.Tensor, priorities: torch.Tensor | None = None) -> None:
        super().on_write(indices, priorities)
        if not indices.numel():
            return
        size = int(indices.max()) + 1
        self.order = _grown(self.order, size, 0)
        self.pending = _grown(self.pending, size, False)
        self.order[indices] = torch.arange(self.next_order, self.next_order + indices.numel())
        self.pending[indices] = True
        self.next_order += indices.numel()

    def on_free(self, indices: torch.Tensor) -> None:
        if indices.numel():
            self.pending[indices] = False

    def pending_count(self) -> int:
        return int(self.pending.sum())

    def can_sample(self, storage_len: int, n: int) -> bool:
        return self.pending_count() >= n

    def sample(
        self, storage_len: int, n: int, generator: torch.Generator, step: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self._check_request(storage_len, n)
        candidates = torch.nonzero(self.pending).flatten()
        if candidates.numel() < n:
            raise InsufficientItemsError(
                f"cannot sample {n} items first-in first-out: only {candidates.numel()} unserved items are stored"
            )
        _, position = torch.topk(self.order[candidates], n, largest=False, sorted=True)
        indices = candidates[position]
        self.pending[indices] = False
        return indices, {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "order": self.order.clone(),
            "pending": self.pending.clone(),
            "next_order": self.next_order,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.order = state["order"].to(torch.int64).clone()
        self.pending = state["pending"].to(torch.bool).clone()
        self.next_order = int(state["next_order"])


class QueueSampler(FifoSampler):
    """The on-policy queue (Reverb's ``Queue``, ``max_times_sampled=1``): oldest unserved item first, each
    item served once, and a full queue holds its producers back instead of overwriting unserved items.

    Sampling is :class:`FifoSampler`'s. The rest is the buffer rank's
    (:mod:`gflowdist.runtime.loops.buffer`): it drops items whose policy lag
    exceeds ``replay.max_staleness`` before serving (ledger: dropped, reason
    ``stale``) and parks a batch that does not fit until sampling makes room;
    unroll actors pace themselves to the learners' consumption
    (:class:`gflowdist.rl.UnrollActor`).
    """

    name = "queue"
    backpressure = True
