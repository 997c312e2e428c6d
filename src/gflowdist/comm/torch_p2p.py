"""Point-to-point framing of the torch.distributed engine, independent of tags.

Every message starts with a header of five int64 words, ``[channel, kind, mode,
total bytes, piece bytes]``; ``mode`` says where the payload is:

=========  ==============================================  ===========================
mode       payload                                         gloo operations
=========  ==============================================  ===========================
INLINE     up to ``INLINE_BYTES``, right behind the        1 (the payload is copied
           header in the same message                      behind the header)
PIECES     larger, in pieces of ``piece bytes`` (at most   1 + pieces, no copy on the
           ``DATA_BYTES``) sent right after the header     sending side
=========  ==============================================  ===========================

A channel of :data:`CLOSE_CHANNEL` is the notice a peer sends when it frees
the communicator.

**Tags carry no meaning.** Every gloo operation of the protocol uses the one
wire tag :data:`HEADER_TAG`, and the receiving side keeps ``HEADER_WINDOW``
receives of one size, ``FRAME_BYTES``, posted for each peer, in order. So
whatever a transport does with tags (gloo matches them; nccl's
point-to-point ignores them), the n-th operation a peer sends lands in the
n-th receive posted for it: headers, pieces and close notices cannot be
taken for one another, and every receive left posted is filled by a close
notice when the peer frees. (Separate tags for headers and payloads, as
before, let a tag-ignoring transport put a payload into a header receive:
messages were lost and, at exit, receives left posted aborted the process
with ``terminate called without an active exception``.)

Because the receives are posted in advance, a sender's message leaves at
once (gloo holds a send back until the receiver has announced a matching
receive; an any-source receive announces nothing until a send arrives). A
piece lands in a posted frame and is copied out of it into the message's
buffer, and the frame is posted again at once.

The receiving side keeps a :class:`Lane` per peer. Gloo reports a receive
complete only from a blocking ``wait()``, so each lane has a thread that
waits and files whole messages; a caller blocked in a plain receive from one
peer waits in gloo itself instead, which saves the hand-off between threads
on every message of a request/reply exchange (see :class:`Lane`).
:func:`close_notices` sends what fills every receive a peer keeps posted, so
no receive is left posted on the group once both sides have freed.
"""

from __future__ import annotations

import collections
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gflowdist.comm.base import AsyncSendHandle
from gflowdist.comm.buffers import BufferPool
from gflowdist.errors import DeadlineError, ProtocolError, TransportError

__all__ = [
    "HEADER_TAG",
    "DATA_TAG",
    "CHUNK_TAG",
    "CLOSE_CHANNEL",
    "INLINE_BYTES",
    "DATA_BYTES",
    "HEADER_WINDOW",
    "PARK_S",
    "Lane",
    "SendHandle",
    "post_message",
    "close_notices",
]

#: the one gloo tag of every operation of the protocol (the tag decides nothing: see the module docstring)
HEADER_TAG = 1 << 20
#: the names of the tags of the framing before it used one tag; the same tag now
CHUNK_TAG = DATA_TAG = HEADER_TAG
#: the channel of the notice a peer sends when it frees the communicator (user tags are >= 0)
CLOSE_CHANNEL = -1
INLINE, PIECES = 0, 1
_HEADER = struct.Struct("<5q")
HEADER_BYTES = _HEADER.size
#: payloads up to this size travel inside the header message (copied once, one gloo operation)
INLINE_BYTES = 64 << 10
#: larger payloads travel in pieces of this size (or the communicator's smaller chunk_bytes)
DATA_BYTES = 1 << 20
#: the size of every receive a lane keeps posted: a header with its inline payload, or a piece
FRAME_BYTES = max(HEADER_BYTES + INLINE_BYTES, DATA_BYTES)
#: receives each lane keeps posted for its peer (so many operations of a peer leave without waiting)
HEADER_WINDOW = 4
#: a lane's thread takes the lane back this long after the last direct receive from it
PARK_S = 0.002
_UINT8 = torch.uint8


def post_message(
    pg: dist.ProcessGroup, dst: int, payload: torch.Tensor, channel: int, kind: int, chunk_bytes: int
) -> tuple[list[Any], list[Any]]:
    """Start sending one message to ``dst`` (a rank of ``pg``): ``(gloo works, buffers to keep)``.

    ``payload`` is a flat uint8 CPU tensor. The caller keeps the parts of one
    message together (a lock) and the buffers alive until every work completes.
    Every part goes out on :data:`HEADER_TAG`, the header first.
    """
    nbytes = payload.numel()
    if nbytes <= INLINE_BYTES:
        envelope = np.empty(HEADER_BYTES + nbytes, dtype=np.uint8)
        _HEADER.pack_into(envelope, 0, channel, kind, INLINE, nbytes, 0)
        if nbytes:
            envelope[HEADER_BYTES:] = payload.numpy()
        message = torch.from_numpy(envelope)
        return [pg.send([message], dst, HEADER_TAG)], [message]
    piece = max(1, min(int(chunk_bytes), DATA_BYTES))
    header = torch.from_numpy(np.frombuffer(_HEADER.pack(channel, kind, PIECES, nbytes, piece), dtype=np.uint8).copy())
    works = [pg.send([header], dst, HEADER_TAG)]
    for start in range(0, nbytes, piece):
        works.append(pg.send([payload[start : start + piece]], dst, HEADER_TAG))
    return works, [header, payload]


def close_notices(pg: dist.ProcessGroup, dst: int) -> tuple[list[Any], list[Any]]:
    """Start sending ``dst`` the close notices: one per receive it keeps posted for this rank."""
    notice = torch.from_numpy(np.frombuffer(_HEADER.pack(CLOSE_CHANNEL, 0, INLINE, 0, 0), dtype=np.uint8).copy())
    works = [pg.send([notice], dst, HEADER_TAG) for _ in range(HEADER_WINDOW)]
    return works, [notice]


class Lane:
    """Everything one peer sends: the receives kept posted for it, and whoever waits on them.

    Exactly one thread at a time holds :attr:`owner` and waits in gloo for the
    lane's next message (:meth:`next_message`): normally the lane's own
    thread (:meth:`serve`), which files every message through ``deliver``;
    or a caller blocked in a plain receive from this peer, which then waits
    in gloo itself and takes its message without a hand-off between threads.
    The lane's thread stays away (:meth:`park`) while callers keep receiving
    directly, and takes the lane back ``PARK_S`` after the last of them, so a
    lane is never left unobserved for longer than that.
    """

    def __init__(self, pg: dist.ProcessGroup, peer: int, p2p_peer: int, max_recv_bytes: Callable[[], int | None]):
        self._pg = pg
        self.peer = peer  # the rank of the communicator (errors name it)
        self._src = p2p_peer  # the same rank in pg
        self._max_recv_bytes = max_recv_bytes
        self.owner = threading.Lock()
        self.closed = False
        self.failure: TransportError | None = None
        #: monotonic time of the last direct receive (the lane's thread parks until PARK_S after it)
        self.last_direct = 0.0
        self._wakeup = threading.Event()
        self._chunk_buffers = BufferPool(max_buffers=2)  # recycled: a fresh 64 MiB costs a page fault per 4 KiB
        # posted from the start: a sender's message goes out at once (see the module docstring)
        self._frames = collections.deque(
            self._post(np.empty(FRAME_BYTES, dtype=np.uint8)) for _ in range(HEADER_WINDOW)
        )
        self._repost: list[np.ndarray] = []  # frames read, to post again before the next wait

    def _post(self, buffer: np.ndarray) -> tuple[Any, np.ndarray]:
        return self._pg.recv([torch.from_numpy(buffer)], self._src, HEADER_TAG), buffer

    def _next_frame(self) -> np.ndarray:
        """Wait for the next operation of the peer; the frame goes back into service at the next call."""
        while self._repost:  # frames read before (kept out of the caller's way until now)
            self._frames.append(self._post(self._repost.pop()))
        work, buffer = self._frames.popleft()
        work.wait()
        self._repost.append(buffer)
        return buffer

    def next_message(self) -> tuple[int, torch.Tensor, int] | None:
        """Wait for the next message: ``(channel, payload, kind)``; None once the peer has freed.

        The caller holds :attr:`owner`. Raises :class:`ProtocolError` for a
        malformed message (the lane goes on) and :class:`TransportError` when
        the pair fails (the lane is done).
        """
        if self.failure is not None:
            raise self.failure
        if self.closed:
            return None
        try:
            buffer = self._next_frame()
            channel, kind, mode, total, chunk = _HEADER.unpack_from(buffer, 0)
            if channel == CLOSE_CHANNEL:
                self._finish()
                return None
            return channel, torch.from_numpy(self._payload(buffer, channel, kind, mode, total, chunk)), kind
        except RuntimeError as exc:  # the pair failed (peer gone, or closed by a timeout)
            self.failure = TransportError(f"receiving from rank {self.peer} failed: {exc}", peer=self.peer)
            raise self.failure from exc

    def serve(
        self,
        deliver: Callable[[int, torch.Tensor, int], None],
        wait_for_room: Callable[[], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        """The lane's thread: file every message with ``deliver(channel, payload, kind)`` until the peer frees.

        ``wait_for_room()`` blocks while the reader is behind (no new receive
        is waited on meanwhile, which pushes back on the sender);
        ``fail(error)`` reports a :class:`ProtocolError` (the thread goes on)
        or a :class:`TransportError` (the thread ends).
        """
        while True:
            self.park()
            with self.owner:
                if time.monotonic() - self.last_direct < PARK_S:
                    continue  # a caller took the lane again while this thread came back: park again
                try:
                    message = self.next_message()
                except ProtocolError as exc:
                    fail(exc)
                    continue
                except TransportError as exc:
                    fail(exc)
                    return
                if message is None:
                    return
                deliver(*message)
            wait_for_room()

    def park(self) -> None:
        """Stay away while callers receive directly, until ``PARK_S`` after the last one or :meth:`wake`."""
        while True:
            idle = time.monotonic() - self.last_direct
            if idle >= PARK_S:
                return
            self._wakeup.wait(PARK_S - idle)
            if self._wakeup.is_set():
                self._wakeup.clear()
                return

    def wake(self) -> None:
        """Make the lane's thread take the lane back now (someone needs it observed)."""
        self.last_direct = 0.0
        self._wakeup.set()

    def _finish(self) -> None:
        """The peer freed: its remaining notices fill the receives still posted.

        The finished works are dropped here, while the process group is surely
        alive: one destroyed at interpreter exit, after the group, can abort
        the process.
        """
        for work, _ in self._frames:
            work.wait()
        self._frames.clear()
        self._repost.clear()
        self.closed = True

    def _payload(self, buffer: np.ndarray, channel: int, kind: int, mode: int, total: int, chunk: int) -> np.ndarray:
        """This message's payload, a numpy array the caller may keep."""
        if not 0 <= channel <= (1 << 31) or kind not in (0, 1):
            raise ProtocolError(f"header names channel {channel} and kind {kind}", sender=self.peer)
        if mode == INLINE and 0 <= total <= INLINE_BYTES:
            return buffer[HEADER_BYTES : HEADER_BYTES + total].copy()
        if mode == PIECES and total > INLINE_BYTES and 0 < chunk <= DATA_BYTES:
            limit = self._max_recv_bytes()
            over = limit is not None and total > limit
            payload = None if over else self._chunk_buffers.take(total)
            for start in range(0, total, chunk):  # each piece in the next frame, whatever its tag
                piece = self._next_frame()
                if payload is not None:
                    payload[start : start + chunk] = piece[: min(chunk, total - start)]
            if payload is None:  # over the limit: read to its end, so the peer's next message is found where it starts
                raise ProtocolError(f"message of {total} bytes is over the limit of {limit}", sender=self.peer)
            return payload
        raise ProtocolError(f"header claims {total} bytes in mode {mode} (pieces of {chunk})", sender=self.peer)


class SendHandle(AsyncSendHandle):
    """A send in flight: done when the send-completion thread has waited on every gloo work of it."""

    __slots__ = ("_buffers", "_done", "_error", "_works", "dst", "nbytes", "tag")

    def __init__(self, dst: int, tag: int, nbytes: int, works: list[Any], buffers: list[Any]):
        self.dst, self.tag, self.nbytes = dst, tag, nbytes
        self._works = works
        self._buffers = buffers  # owned until complete
        self._done = threading.Event()
        self._error: BaseException | None = None

    def is_complete(self) -> bool:
        if self._done.is_set() and self._error is not None:
            raise TransportError(f"send to rank {self.dst} failed: {self._error}", peer=self.dst)
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        if not self._done.wait(timeout):
            raise DeadlineError(
                f"send of {self.nbytes} bytes to rank {self.dst} (tag {self.tag}): not complete within {timeout:g} s",
                peer=self.dst,
            )
        self.is_complete()

    def _complete(self) -> None:
        """Called by the send-completion thread: block until the transport released the buffers."""
        try:
            for work in self._works:
                work.wait()
        except RuntimeError as exc:  # a failed pair surfaces here; report it to the owner
            self._error = exc
        self._works = []
        self._buffers = []
        self._done.set()
