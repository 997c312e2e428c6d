"""What admitting items to a replay buffer can answer: :class:`AdmitResult`, :class:`RateLimitedError`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gflowdist.errors import GflowdistError

__all__ = ["AdmitResult", "RateLimitedError"]


class RateLimitedError(GflowdistError):
    """``extend`` or ``sample`` was called while the rate limiter forbids it."""


@dataclass(frozen=True)
class AdmitResult:
    """What :meth:`ReplayBuffer.extend` did with ``offered`` items.

    ``offered == admitted + rejected_duplicate + rejected_low_score``;
    ``evicted`` counts stored items (older ones, or admitted ones overwritten
    within the call) that left the buffer. ``slots[k]`` is where item ``k``
    is stored, ``-1`` if it is not; ``admitted_mask[k]`` whether it passed
    admission.
    """

    offered: int
    admitted: int
    rejected_duplicate: int
    rejected_low_score: int
    evicted: int
    slots: torch.Tensor
    admitted_mask: torch.Tensor
