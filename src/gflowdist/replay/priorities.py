"""What prioritized replay needs besides the sampler: item keys and the beta schedule.

**Keys.** A sampled item is named by one int64 *key* that encodes its slot
and the insertion step of the item that was in that slot when it was
sampled (the insertion step is unique per admitted item, so it is the
slot's generation stamp)::

    key  = insert_step * capacity + slot
    slot = key % capacity,  insert_step = key // capacity

A priority update for a key applies only while that slot is live and still
holds the same item; a key whose slot was overwritten (or freed) since is
*stale*: ignored and counted (:func:`current_keys`). Keys survive a
checkpoint (the insertion steps are part of the buffer's metadata).

**Beta schedule.** The importance-weight exponent anneals linearly from
``start`` to ``final`` over ``steps`` steps (Schaul et al. 2016 anneal it
to 1 over training), then stays at ``final``::

    beta(t) = start + (final - start) * min(t, steps) / steps     (steps > 0)
    beta(t) = start                                                (final is None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gflowdist.errors import ConfigError

__all__ = ["BetaSchedule", "current_keys", "item_keys", "split_keys", "check_priorities"]

_INT64_MAX = 2**63 - 1


def _check_exponent(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"must be a finite number >= 0, got {value!r}", key=key)
    return float(value)


@dataclass(frozen=True)
class BetaSchedule:
    """``beta(step)``: linear from ``start`` to ``final`` over ``steps`` steps, then ``final``.

    ``final=None`` keeps ``start`` for ever (``steps`` must then be 0).
    """

    start: float
    final: float | None = None
    steps: int = 0

    def __post_init__(self) -> None:
        _check_exponent(self.start, "replay.priority_beta")
        if self.final is None:
            if self.steps:
                raise ConfigError(
                    f"is {self.steps} but replay.priority_beta_final is null: there is nothing to anneal towards",
                    key="replay.priority_beta_steps",
                )
            return
        _check_exponent(self.final, "replay.priority_beta_final")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ConfigError(
                f"must be a positive int when replay.priority_beta_final is set, got {self.steps!r}",
                key="replay.priority_beta_steps",
            )

    def value(self, step: int) -> float:
        """Beta at ``step`` (``step < 0`` counts as 0)."""
        if self.final is None:
            return self.start
        done = min(max(step, 0), self.steps) / self.steps
        return self.start + (self.final - self.start) * done


def item_keys(slots: torch.Tensor, insert_steps: torch.Tensor, capacity: int) -> torch.Tensor:
    """The int64 keys of the items at ``slots`` whose insertion steps are ``insert_steps``."""
    if insert_steps.numel() and int(insert_steps.max()) > (_INT64_MAX - capacity) // capacity:
        raise OverflowError(
            f"insertion step {int(insert_steps.max())} times capacity {capacity} does not fit an int64 key"
        )
    return insert_steps.to(torch.int64) * capacity + slots.to(torch.int64)


def split_keys(keys: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(slots, insert_steps)`` of ``keys`` (see :func:`item_keys`)."""
    keys = torch.as_tensor(keys, dtype=torch.int64).flatten()
    if keys.numel() and int(keys.min()) < 0:
        raise ValueError(f"item keys are >= 0, got {int(keys.min())}")
    return keys % capacity, keys // capacity


def current_keys(
    keys: torch.Tensor, capacity: int, live: torch.Tensor, stored_steps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask, slots)``: which ``keys`` still name the item in their slot, and the slots.

    ``live[s]`` says whether slot ``s`` holds an item; ``stored_steps[s]`` is
    the insertion step of the item it holds.
    """
    slots, steps = split_keys(keys, capacity)
    return live[slots] & (stored_steps[slots] == steps), slots


def check_priorities(priorities: torch.Tensor, count: int) -> torch.Tensor:
    """``priorities`` as a flat float64 tensor of ``count`` finite values ``>= 0``."""
    priorities = torch.as_tensor(priorities, dtype=torch.float64).flatten()
    if priorities.numel() != count:
        raise ValueError(f"{priorities.numel()} priorities for {count} items")
    if count and (not bool(torch.isfinite(priorities).all()) or bool((priorities < 0).any())):
        raise ValueError(
            f"priorities must be finite and >= 0 (got min {float(priorities.min())}, max {float(priorities.max())})"
        )
    return priorities
