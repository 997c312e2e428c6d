"""Per-rank seeds derived from one run seed.

Rank ``r``'s seed is the first 63 bits of
``numpy.random.SeedSequence(run_seed, spawn_key=(r,))`` — exactly the
``r``-th child of ``SeedSequence(run_seed).spawn(...)``. It depends only on
``(run_seed, r)``: the same on every machine and every run, distinct between
ranks (SeedSequence hashes the spawn key into the whole state), and
independent of the world size, so a rank keeps its stream when the job
grows.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from gflowdist.comm.native import Group
from gflowdist.ops.collectives import group_or_world

__all__ = ["rank_seed", "rank_seeds", "seed_rank", "seed_all"]

_MASK_63 = (1 << 63) - 1


def _check_seed(run_seed: int) -> int:
    if isinstance(run_seed, bool) or not isinstance(run_seed, (int, np.integer)) or run_seed < 0:
        raise ValueError(f"run seed must be a non-negative int, got {run_seed!r}")
    return int(run_seed)


def rank_seed(run_seed: int, rank: int) -> int:
    """The seed of ``rank`` in a run seeded with ``run_seed`` (an int in ``[0, 2**63)``)."""
    sequence = np.random.SeedSequence(_check_seed(run_seed), spawn_key=(int(rank),))
    low, high = (int(v) for v in sequence.generate_state(2, np.uint32))
    return ((high << 32) | low) & _MASK_63


def rank_seeds(run_seed: int, n: int) -> list[int]:
    """Seeds of ranks ``0 .. n-1`` (the same list on every rank)."""
    return [rank_seed(run_seed, r) for r in range(n)]


def seed_rank(run_seed: int, group: Group | None = None) -> int:
    """Seed Python's ``random``, numpy's global generator and torch with this rank's seed.

    The rank is this process's rank in ``group`` (None: the world). Returns
    the seed. numpy's legacy global generator takes 32 bits: it gets the seed
    modulo ``2**32``. No communication.
    """
    seed = rank_seed(run_seed, group_or_world(group).rank)
    seed_all(seed)
    return seed


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator (``seed`` modulo ``2**32``) and torch with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
