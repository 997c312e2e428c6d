"""Fair CPU threads: ranks on one machine should not each use every core.

The rule Spinning Up and OmniSafe apply at start-up: when torch would use
``t > 1`` intra-op threads in a world of ``w`` ranks, use
``max(int(t / w), 1)``; with one thread already, change nothing.
"""

from __future__ import annotations

import torch

__all__ = ["fair_threads", "share_torch_threads"]


def fair_threads(threads: int, world_size: int) -> int:
    """``max(int(threads / world_size), 1)`` when ``threads > 1``, else ``threads``."""
    if threads <= 1:
        return threads
    return max(int(threads / max(world_size, 1)), 1)


def share_torch_threads(world_size: int) -> tuple[int, int]:
    """Apply :func:`fair_threads` to torch; returns ``(before, after)``."""
    before = torch.get_num_threads()
    after = fair_threads(before, world_size)
    if after != before:
        torch.set_num_threads(after)
    return before, after
