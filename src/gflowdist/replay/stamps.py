"""The int64 metadata a replay buffer keeps per slot: who produced an item, its number, its version.

``STAMPS`` names the columns of ``ReplayBuffer.stamps`` (one row per slot);
:func:`stamp_rows` builds the rows of a batch being offered from what the
caller passed (an int for the whole batch, or a tensor with one value per
item). The insertion step, the last column, is filled by the buffer at
admission.
"""

from __future__ import annotations

import torch

__all__ = ["STAMPS", "stamp_rows"]

#: int64 metadata, one column each of ReplayBuffer.stamps; the score is kept apart (float32).
STAMPS = ("producer", "seq", "policy_version", "insert_step")


def _fill(column: torch.Tensor, value: int | torch.Tensor, name: str, consecutive: bool = False) -> None:
    """Write an int (or, if ``consecutive``, ``value + arange``) or a tensor into ``column``."""
    size = column.numel()
    if isinstance(value, torch.Tensor):
        if value.numel() != size:
            raise ValueError(f"{name} has {value.numel()} entries for a batch of {size}")
        if value.dtype.is_floating_point or value.dtype.is_complex:
            raise ValueError(f"{name} must hold integers, got {value.dtype}")
        column.copy_(value.flatten())
    elif isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int or a tensor of {size} ints, got {value!r}")
    elif consecutive:
        column.copy_(torch.arange(value, value + size))
    else:
        column.fill_(value)


def stamp_rows(
    size: int, producer: int | torch.Tensor, seq: int | torch.Tensor, policy_version: int | torch.Tensor
) -> torch.Tensor:
    """``[size, len(STAMPS)]`` rows; ``seq`` as an int is the first of ``size`` consecutive numbers.

    The ``insert_step`` column is left for the buffer to fill.
    """
    rows = torch.empty(size, len(STAMPS), dtype=torch.int64)
    _fill(rows[:, 0], producer, "producer")
    _fill(rows[:, 1], seq, "seq", consecutive=True)
    _fill(rows[:, 2], policy_version, "policy_version")
    return rows
