"""The MPI engine's wire: the tag a message travels on, and the handle of a nonblocking send.

A message of ``tag`` and ``kind`` (0/1, the bit
:meth:`~gflowdist.comm.base.Communicator.recv_kind` reads back) travels on MPI
tag ``tag << 2 | kind << 1``; a chunked one (larger than ``chunk_bytes``) on
that tag ``| 1`` (see :mod:`gflowdist.comm.mpi`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from gflowdist.comm.base import AsyncSendHandle
from gflowdist.comm.polling import peer_wait, poll_until

__all__ = ["CHUNKED", "KIND_SHIFT", "TAG_SHIFT", "MPISendHandle", "drain_part", "wire_tag"]

CHUNKED = 1
KIND_SHIFT = 1
TAG_SHIFT = 2


def wire_tag(tag: int, kind: int = 0, chunked: bool = False) -> int:
    """The MPI tag a message of ``tag`` and ``kind`` (0/1) travels on: ``tag << 2 | kind << 1 | chunked``."""
    return (tag << TAG_SHIFT) | (kind << KIND_SHIFT) | (CHUNKED if chunked else 0)


class MPISendHandle(AsyncSendHandle):
    """A nonblocking send of one message (one request, or a chunked message's several): complete when all are."""

    __slots__ = ("_buffers", "_done", "_requests", "dst", "nbytes", "tag")

    def __init__(self, dst: int, tag: int, nbytes: int, requests: list[MPI.Request], buffers: list[Any]):
        self.dst, self.tag, self.nbytes = dst, tag, nbytes
        self._requests = requests
        self._buffers = buffers  # owned until complete
        self._done = False

    def is_complete(self) -> bool:
        if not self._done and MPI.Request.Testall(self._requests):
            self._done = True
            self._buffers = []
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        # Spin about as long as the transfer should take (1 GB/s), then back off.
        backoff = peer_wait(self.nbytes)
        poll_until(
            lambda: True if self.is_complete() else None,
            timeout=timeout,
            what=f"send of {self.nbytes} bytes to rank {self.dst} (tag {self.tag})",
            peer=self.dst,
            backoff=backoff,
        )


def drain_part(
    message: MPI.Message, status: MPI.Status, draining: dict[tuple[int, int], int], sender: int, wire: int
) -> None:
    """Receive and drop a part of a refused chunked message; ``draining[(sender, wire)]`` counts the bytes
    still to come (the entry goes once they have)."""
    count = status.Get_count(MPI.BYTE)
    message.Recv([np.empty(count, dtype=np.uint8), MPI.BYTE])
    left = draining[(sender, wire)] - max(count, 1)
    if left > 0:
        draining[(sender, wire)] = left
    else:
        del draining[(sender, wire)]
