"""The int64 metadata a replay buffer keeps per slot: who produced an item, its number, its version.

``STAMPS`` names the columns of ``ReplayBuffer.stamps`` (one row per slot);
:func:`stamp_rows` builds the rows of a batch being offered from what the
caller passed (an int for the whole batch, or a tensor with one value per
item). The insertion step, the last column, is filled by the buffer at
admission.

:class:`ItemStamps` is a sampler's read-only view of these columns (``sampler.items``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["ItemStamps", "STAMPS", "stamp_rows"]

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


class ItemStamps:
    """A sampler's read-only view of the stored items' stamps (``sampler.items``, set by the buffer).

    Every method returns copies, indexed by slot: what the sampler reads
    cannot change the buffer. A staleness-aware sampler compares
    :meth:`policy_version` with the ``step`` it is asked at (the learner
    step, i.e. policy version, that will use the batch)::

        slots = self.items.live()
        lag = step - self.items.policy_version(slots)
    """

    def __init__(self, stamps: Callable[[], torch.Tensor], live: Callable[[], torch.Tensor]):
        self._stamps, self._live = stamps, live

    def live(self) -> torch.Tensor:
        """The slots that hold an item (int64, ascending)."""
        return torch.nonzero(self._live()).flatten()

    def _column(self, name: str, slots: torch.Tensor | None) -> torch.Tensor:
        column = self._stamps()[:, STAMPS.index(name)]
        return column.clone() if slots is None else column[torch.as_tensor(slots, dtype=torch.int64)]

    def policy_version(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The policy version each item's producer stamped on it."""
        return self._column("policy_version", slots)

    def producer(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """The rank that produced each item."""
        return self._column("producer", slots)

    def admission(self, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Each item's admission order (how many items the buffer admitted before it)."""
        return self._column("insert_step", slots)
