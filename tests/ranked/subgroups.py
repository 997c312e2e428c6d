"""Sub-groups the ranked suites of ops and compat split the world into (a helper, not a suite)."""

from __future__ import annotations

import pytest


def halves(size: int) -> list[list[int]]:
    """The lower and upper half of the ranks (one group of one in a world of one)."""
    if size == 1:
        return [[0]]
    return [list(range(size // 2)), list(range(size // 2, size))]


def my_half(rank: int, size: int) -> list[int]:
    """The members of ``rank``'s half."""
    return next(group for group in halves(size) if rank in group)


@pytest.fixture(scope="module")
def half(comm):
    """This rank's half of the world, as a communicator (freed after the module)."""
    sub = comm.split(halves(comm.size))
    yield sub
    sub.free()
