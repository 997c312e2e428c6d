"""Admission: which offered items are stored, in which slot, and what they displace.

A writer places a batch into a :class:`~gflowdist.replay.storage.TensorStorage`::

    result = writer.extend(storage, batch, scores)
    indices, admitted, evicted, rejected = result

and accounts for every offered item. With ``B`` items offered::

    B == admitted.sum() + sum(rejected.values())
    len(storage) after == len(storage) before + admitted.sum() - evicted

``indices[k]`` is the slot item ``k`` now occupies, or ``-1`` when it is not
stored (rejected, or admitted and then overwritten within the same call,
which also counts as evicted). An admitted item is always stored unless
more than ``capacity`` items were admitted in the call; the buffer relies on
that. Stored items keep batch order in insertion order. ``rejected`` maps a reason to a count:
``"duplicate"`` (:class:`DedupWriter`) or ``"low_score"``
(:class:`KeepHighestWriter`).

Writers fill free slots from the lowest index up, so as long as nothing is
freed the live slots are exactly ``[0, len(storage))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from gflowdist.errors import ConfigError
from gflowdist.replay.component import Component
from gflowdist.replay.key_index import HashIndex, first_occurrence, row_hash
from gflowdist.replay.storage import Batch, TensorStorage

__all__ = [
    "DedupWriter",
    "KeepHighestWriter",
    "RoundRobinWriter",
    "WriteResult",
    "Writer",
    "take",
]

REJECTED_DUPLICATE = "duplicate"
REJECTED_LOW_SCORE = "low_score"


class WriteResult(NamedTuple):
    """Outcome of :meth:`Writer.extend` for a batch of ``B`` offered items."""

    indices: torch.Tensor  # int64 [B]: slot of each stored item, -1 if not stored
    admitted: torch.Tensor  # bool [B]: passed admission
    evicted: int  # live items removed from the storage by this call
    rejected: dict[str, int]  # reason -> number of items refused


def _nothing_stored(size: int, rejected: dict[str, int]) -> WriteResult:
    return WriteResult(torch.full((size,), -1, dtype=torch.int64), torch.zeros(size, dtype=torch.bool), 0, rejected)


def take(batch: Mapping[str, torch.Tensor], positions: torch.Tensor | None) -> Batch:
    """The rows ``positions`` of every field (``None`` means all rows, no copy)."""
    if positions is None:
        return dict(batch)
    return {name: value[positions] for name, value in batch.items()}


class Writer(Component):
    """Base class: the protocol every writer follows."""

    kind = "writer"
    name = "writer"

    def extend(
        self, storage: TensorStorage, batch: Mapping[str, torch.Tensor], scores: torch.Tensor | None
    ) -> WriteResult:
        raise NotImplementedError


class RoundRobinWriter(Writer):
    """Write at a cursor that walks the slots ``0, 1, ..., capacity-1, 0, ...``.

    Every item is admitted. Item ``k`` of a batch goes to slot
    ``(cursor + k) % capacity``; when the storage is full that overwrites the
    oldest item, which counts as evicted if it was live. A batch larger than
    the capacity keeps its last ``capacity`` items; the earlier ones count as
    admitted and evicted.
    """

    name = "round_robin"

    def __init__(self) -> None:
        self.cursor = 0

    def extend(
        self, storage: TensorStorage, batch: Mapping[str, torch.Tensor], scores: torch.Tensor | None
    ) -> WriteResult:
        size = storage.check_schema(batch)
        capacity = storage.capacity
        start = self.cursor
        slots = torch.arange(start, start + size)
        self.cursor = (start + size) % capacity
        overwritten_in_call = max(0, size - capacity)
        if start + size <= capacity:  # no wrap: one contiguous copy
            evicted = storage.write(slice(start, start + size), batch)
        elif overwritten_in_call == 0:
            slots %= capacity
            evicted = storage.write(slots, batch)
        else:
            slots %= capacity
            kept = torch.arange(overwritten_in_call, size)
            evicted = storage.write(slots[kept], take(batch, kept)) + overwritten_in_call
            slots[:overwritten_in_call] = -1
        return WriteResult(slots, torch.ones(size, dtype=torch.bool), evicted, {})

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.cursor = int(state["cursor"])


def _check_scores(scores: torch.Tensor | None, size: int, who: str) -> torch.Tensor:
    if scores is None:
        raise ValueError(f"{who} needs a score per item; extend(..., scores=...) was not given")
    scores = torch.as_tensor(scores).flatten().to(torch.float64)
    if scores.numel() != size:
        raise ValueError(f"{scores.numel()} scores for a batch of {size}")
    if bool(torch.isnan(scores).any()):
        raise ValueError(f"{who}: NaN scores cannot be ranked")
    return scores


class KeepHighestWriter(Writer):
    """Keep the ``capacity`` highest-scoring items ever offered.

    While there are free slots every item is admitted (lowest free slot
    first). When the batch does not fit, the stored items and the offered
    ones are ranked together by score, descending, and the top ``capacity``
    stay: stored items that fall out are evicted, offered items that do not
    make it are rejected as ``"low_score"``. Ties favour what is already
    stored, then earlier items of the batch; so an offered item must score
    strictly above the current minimum to displace it.

    Cost per call with ``B`` offered and ``N`` stored: when the buffer is full
    and no offered score beats the cached minimum, ``O(B)``; otherwise one
    ``topk`` of the ``B`` lowest stored scores (``O(N)``) and a sort of
    ``2B`` candidates (only the ``B`` lowest stored items can be displaced).
    """

    name = "keep_highest"

    def __init__(self) -> None:
        self.scores = torch.zeros(0, dtype=torch.float64)
        self._minimum: float | None = None  # min of self.scores while the storage is full

    def extend(
        self, storage: TensorStorage, batch: Mapping[str, torch.Tensor], scores: torch.Tensor | None
    ) -> WriteResult:
        size = storage.check_schema(batch)
        scores = _check_scores(scores, size, "KeepHighestWriter")
        if size == 0:
            return _nothing_stored(0, {})
        if self.scores.numel() != storage.capacity:
            self.scores = torch.zeros(storage.capacity, dtype=torch.float64)
        indices = torch.full((size,), -1, dtype=torch.int64)
        if storage.full:
            if self._minimum is None:
                self._minimum = float(self.scores.min())
            if float(scores.max()) <= self._minimum:
                return _nothing_stored(size, {REJECTED_LOW_SCORE: size})
            free = torch.zeros(0, dtype=torch.int64)
        else:
            free = torch.nonzero(~storage.live).flatten()
        if size <= free.numel():
            kept, targets, evicted = None, free[:size], 0
        else:
            lowest = min(size, len(storage))
            if storage.full:
                low_scores, low_slots = torch.topk(self.scores, lowest, largest=False)
            else:
                live = storage.live_indices()
                low_scores, position = torch.topk(self.scores[live], lowest, largest=False)
                low_slots = live[position]
            survivors = free.numel() + lowest
            ranked = torch.sort(torch.cat([low_scores, scores]), descending=True, stable=True).indices[:survivors]
            stored_kept = torch.zeros(lowest, dtype=torch.bool)
            stored_kept[ranked[ranked < lowest]] = True
            kept = torch.sort(ranked[ranked >= lowest] - lowest).values
            displaced = low_slots[~stored_kept]
            targets = torch.cat([free, displaced])
            evicted = displaced.numel()
        storage.write(targets, take(batch, kept))
        admitted_positions = slice(None) if kept is None else kept
        indices[admitted_positions] = targets
        self.scores[targets] = scores[admitted_positions]
        self._minimum = None
        admitted = indices >= 0
        rejected = size - int(admitted.sum())
        return WriteResult(indices, admitted, evicted, {REJECTED_LOW_SCORE: rejected} if rejected else {})

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scores": self.scores.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.scores = state["scores"].to(torch.float64).clone()
        self._minimum = None


class DedupWriter(Writer):
    """Refuse items whose key is already stored; place the rest with ``inner``.

    Args:
        key: a field name (its rows are the keys, e.g. the terminal state) or
            a function ``batch -> Tensor[B, ...]``.
        inner: the writer that places admitted items (default round robin), so
            capacity is handled the inner writer's way.

    An offered item is rejected as ``"duplicate"`` when the :func:`row_hash`
    of its key equals that of a live stored item, or of an earlier item of the
    same batch. So the storage never holds two items with the same key; the
    only error is a false rejection on a hash collision of two distinct
    multi-word keys (probability about ``2**-64`` per pair). A key counts as
    stored if it was stored before this call, even if this call evicts it; a
    key whose item was consumed (FIFO) or evicted earlier may come back.
    Membership uses a vectorised hash index (see ``HashIndex``): binary
    search plus a small all-against-all tail, no per-item Python loop.
    """

    name = "dedup"

    def __init__(self, key: str | Callable[[Batch], torch.Tensor], inner: Writer | None = None):
        if not (isinstance(key, str) or callable(key)):
            raise ConfigError(f"must be a field name or a function of the batch, got {key!r}", key="replay.dedup_key")
        self.key = key
        self.inner = inner if inner is not None else RoundRobinWriter()
        self.slot_hash = torch.zeros(0, dtype=torch.int64)
        self._index: HashIndex | None = HashIndex()

    def keys(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(self.key, str):
            if self.key not in batch:
                raise ValueError(f"dedup key field {self.key!r} is not in the batch (fields: {sorted(batch)})")
            return batch[self.key]
        return self.key(dict(batch))

    def extend(
        self, storage: TensorStorage, batch: Mapping[str, torch.Tensor], scores: torch.Tensor | None
    ) -> WriteResult:
        size = storage.check_schema(batch)
        if self.slot_hash.numel() != storage.capacity:
            self.slot_hash = torch.zeros(storage.capacity, dtype=torch.int64)
        hashes = row_hash(self.keys(batch))
        if hashes.numel() != size:
            raise ValueError(f"the dedup key gave {hashes.numel()} rows for a batch of {size}")
        if self._index is None:  # after load_state_dict
            self._index = HashIndex()
            self._index.rebuild(self.slot_hash.clone(), torch.arange(storage.capacity), storage.live, self.slot_hash)
        fresh = first_occurrence(hashes) & ~self._index.contains(hashes, storage.live, self.slot_hash)
        candidates = torch.nonzero(fresh).flatten()
        if candidates.numel() == size:
            result = self.inner.extend(storage, batch, scores)
        elif candidates.numel() == 0:
            result = _nothing_stored(0, {})
        else:
            sub_scores = None if scores is None else torch.as_tensor(scores)[candidates]
            result = self.inner.extend(storage, take(batch, candidates), sub_scores)
        indices = torch.full((size,), -1, dtype=torch.int64)
        admitted = torch.zeros(size, dtype=torch.bool)
        indices[candidates] = result.indices
        admitted[candidates] = result.admitted
        stored = indices >= 0
        slots, stored_hashes = indices[stored], hashes[stored]
        self.slot_hash[slots] = stored_hashes
        self._index.add(stored_hashes, slots, storage.live, self.slot_hash)
        rejected = dict(result.rejected)
        if size - candidates.numel():
            rejected[REJECTED_DUPLICATE] = size - candidates.numel()
        return WriteResult(indices, admitted, result.evicted, rejected)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "slot_hash": self.slot_hash.clone(), "inner": self.inner.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.slot_hash = state["slot_hash"].to(torch.int64).clone()
        self.inner.load_state_dict(state["inner"])
        self._index = None  # rebuilt from slot_hash and the storage at the next extend
