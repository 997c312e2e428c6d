"""Keys of items as 64-bit hashes, and an index of which live slot holds a hash.

Used by :class:`~gflowdist.replay.writers.DedupWriter`: :func:`row_hash`
turns each row of a key tensor into one int64, :class:`HashIndex` answers
"is this hash held by a live slot?" for a whole batch at once.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["HashIndex", "first_occurrence", "row_hash"]


# splitmix64 constants (Steele, Lea, Flood 2014), as unsigned 64-bit integers.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, element-wise on uint64 (wrapping); a bijection of 64-bit words."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MUL1
    x = (x ^ (x >> np.uint64(27))) * _MUL2
    return np.asarray(x ^ (x >> np.uint64(31)))


def row_hash(keys: torch.Tensor) -> torch.Tensor:
    """A 64-bit hash of each row of ``keys`` (leading dim = items), as int64 ``[B]``.

    The row is flattened to ``w`` words ``x_j`` (integers and bools widened to
    64 bits, floats taken bitwise) and hashed as::

        h = mix( sum_j mix(x_j + j * GOLDEN) )      (uint64, wrapping)

    with ``mix`` the splitmix64 finaliser. For a single-word key ``h`` is a
    bijection (no collisions at all); for wider keys two distinct rows collide
    with probability about ``2**-64``.
    """
    if keys.dim() == 0:
        raise ValueError("dedup keys need a leading item dimension")
    rows = keys.detach().cpu().reshape(keys.shape[0], -1)
    if rows.dtype.is_floating_point or rows.dtype.is_complex:
        rows = rows.contiguous().view(
            {2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[rows.element_size()]
        )
    words = rows.to(torch.int64).numpy().view(np.uint64)
    offsets = np.arange(words.shape[1], dtype=np.uint64) * _GOLDEN
    with np.errstate(over="ignore"):
        mixed = _splitmix64(words + offsets).sum(axis=1, dtype=np.uint64)
        hashed = _splitmix64(mixed)
    return torch.from_numpy(hashed.view(np.int64).copy())


def first_occurrence(values: torch.Tensor) -> torch.Tensor:
    """Mask of the positions where each distinct value appears first."""
    unique, inverse = torch.unique(values, return_inverse=True)
    positions = torch.arange(values.numel())
    first = torch.full((unique.numel(),), values.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    return first[inverse] == positions


class HashIndex:
    """Which live slot holds a given key hash, without a per-item Python loop.

    Entries are ``(hash, slot)`` pairs: a sorted *main* run (binary search) and
    an unsorted *tail* of recent inserts (compared all against all). An entry
    is valid while ``live[slot]`` and ``slot_hash[slot] == hash``, so
    evictions and frees need no bookkeeping: stale entries just stop
    matching. When the tail exceeds ``tail_limit`` entries, main and tail are
    merged and stale entries dropped (one sort, amortised over the inserts).
    Lookup of ``B`` hashes: ``O(B log N + B * tail_limit)``.
    """

    def __init__(self, tail_limit: int = 1024):
        self.tail_limit = tail_limit
        empty = torch.zeros(0, dtype=torch.int64)
        self.main_hash, self.main_slot = empty, empty
        self.tail_hash, self.tail_slot = empty, empty

    @staticmethod
    def _valid(hashes: torch.Tensor, slots: torch.Tensor, live: torch.Tensor, slot_hash: torch.Tensor) -> torch.Tensor:
        return live[slots] & (slot_hash[slots] == hashes)

    def contains(self, hashes: torch.Tensor, live: torch.Tensor, slot_hash: torch.Tensor) -> torch.Tensor:
        found = torch.zeros(hashes.numel(), dtype=torch.bool)
        if self.main_hash.numel():
            position = torch.searchsorted(self.main_hash, hashes).clamp_(max=self.main_hash.numel() - 1)
            found |= self._valid(self.main_hash[position], self.main_slot[position], live, slot_hash) & (
                self.main_hash[position] == hashes
            )
        if self.tail_hash.numel():
            valid = self._valid(self.tail_hash, self.tail_slot, live, slot_hash)
            found |= ((hashes[:, None] == self.tail_hash[None, :]) & valid).any(1)
        return found

    def add(self, hashes: torch.Tensor, slots: torch.Tensor, live: torch.Tensor, slot_hash: torch.Tensor) -> None:
        self.tail_hash = torch.cat([self.tail_hash, hashes])
        self.tail_slot = torch.cat([self.tail_slot, slots])
        if self.tail_hash.numel() > self.tail_limit:
            self.rebuild(
                torch.cat([self.main_hash, self.tail_hash]),
                torch.cat([self.main_slot, self.tail_slot]),
                live,
                slot_hash,
            )

    def rebuild(self, hashes: torch.Tensor, slots: torch.Tensor, live: torch.Tensor, slot_hash: torch.Tensor) -> None:
        valid = self._valid(hashes, slots, live, slot_hash)
        hashes, order = torch.sort(hashes[valid])
        slots = slots[valid][order]
        # equal valid hashes can only be the same slot listed twice: keep one
        first = torch.ones(hashes.numel(), dtype=torch.bool)
        first[1:] = hashes[1:] != hashes[:-1]
        self.main_hash, self.main_slot = hashes[first], slots[first]
        self.tail_hash = self.tail_slot = torch.zeros(0, dtype=torch.int64)
