"""A world of one: the communicator of a process started without any launcher.

Collectives return the answers a 1-rank job gives (a sum over one rank is the
value itself), and point-to-point messages to rank 0 loop back through an
in-process queue, so role loops can be unit-tested in one process. This
fallback is deliberate: :func:`gflowdist.comm.select.world_comm` only picks it
when no launcher variables are present, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gflowdist.comm.base import (
    ArrayLike,
    AsyncSendHandle,
    Communicator,
    CompletedSend,
    Inbox,
    ReduceOp,
    check_groups,
    file_in_inbox,
    require_float_for_avg,
    take_from_inbox,
)
from gflowdist.comm.buffers import as_byte_array
from gflowdist.engines import LOCAL

__all__ = ["LocalComm"]


def _copy(x: ArrayLike) -> ArrayLike:
    return x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)


class LocalComm(Communicator):
    """Rank 0 of a world of size 1."""

    engine = LOCAL.name

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self._inbox: Inbox = {}

    def barrier(self, timeout: float | None = None) -> None:
        return None

    def all_reduce(self, x: ArrayLike, op: ReduceOp = ReduceOp.SUM, *, inplace: bool = True) -> ArrayLike:
        if op is ReduceOp.AVG:
            require_float_for_avg(x)
        return x if inplace else _copy(x)

    def all_gather(self, x: ArrayLike) -> list[ArrayLike]:
        return [_copy(x)]

    def broadcast(self, x: ArrayLike, src: int = 0) -> ArrayLike:
        self._check_peer(src, "src")
        return x

    def gather(self, x: ArrayLike, dst: int = 0) -> list[ArrayLike] | None:
        self._check_peer(dst, "dst")
        return [_copy(x)]

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        return [bytes(data)]

    def split(self, groups: Sequence[Sequence[int]]) -> LocalComm | None:
        groups = check_groups(groups, 1)
        return LocalComm() if groups else None

    def isend(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0) -> AsyncSendHandle:
        self._check_send(dst, tag, kind)
        payload = torch.from_numpy(as_byte_array(data).copy())
        file_in_inbox(self._inbox, tag, (0, payload, kind))
        return CompletedSend(dst, tag, payload.numel())

    def try_recv_kind(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor, int] | None:
        self._check_peer(src, "src", allow_none=True)
        return take_from_inbox(self._inbox, src, tag)
