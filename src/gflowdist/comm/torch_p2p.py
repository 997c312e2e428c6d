"""Point-to-point framing of the torch.distributed engine, independent of tags.

Every message starts with a header of five int64 words, ``[channel, kind, mode,
total bytes, piece bytes]``; ``mode`` says where the payload is:

=========  ==============================================  ===========================
mode       payload                                         gloo operations
=========  ==============================================  ===========================
INLINE     up to ``INLINE_BYTES``, right behind the        1 (the payload is copied
           header in the same message                      behind the header)
PIECES     larger, in the pieces :func:`piece_bounds`      1 + pieces, no copy on the
           lays out, sent right after the header           sending side
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
receive; an any-source receive announces nothing until a send arrives).

**Where a payload lands.** An inline payload lands in a frame with its
header: from ``HAND_OVER_BYTES`` on, that frame *is* the payload handed to
the caller (no copy; a frame from the lane's pool takes its place, and comes
back into service once the caller drops the message), below it the payload
is copied out. When the header of a message in pieces has been read,
exactly ``HEADER_WINDOW - 1`` frames are still posted, so the peer's next
operations land in them: the message opens with ``LEAD_PIECES`` pieces of
``LEAD_BYTES`` that fill those frames (copied out: 12 KiB), and its other
pieces, up to ``DIRECT_BYTES`` each, land straight in the message's buffer:
their receives are posted as soon as the header is read, in order, and no
frame is posted again before the last of them. Before this, payloads above
64 KiB travelled in 1 MiB pieces that each landed in a frame and were copied
out of it: a 1 MiB message was two gloo operations and a copy, a 16 MiB one
17 operations and a 16 MiB copy (docs/transport.md, "gloo: pieces received
in place").

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
import itertools
import struct
import threading
import time
from collections.abc import Callable, Iterator
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
INLINE_BYTES = 1 << 20
#: the size of every receive a lane keeps posted: a header with its inline payload, or a lead piece
FRAME_BYTES = HEADER_BYTES + INLINE_BYTES
#: receives each lane keeps posted for its peer (so many operations of a peer leave without waiting)
HEADER_WINDOW = 4
#: a lane's thread takes the lane back this long after the last direct receive from it
PARK_S = 0.002
#: an inline payload of at least this size is handed over in the frame it landed in (no copy)
HAND_OVER_BYTES = INLINE_BYTES // 2
#: the pieces of a message that land in the frames its receiver had posted before its header: small, copied out
LEAD_PIECES = HEADER_WINDOW - 1
LEAD_BYTES = 4 << 10
#: pieces after the lead ones are at most this large (or the communicator's smaller chunk_bytes); a receiver
#: reads the pieces of a message over its limit into one buffer of this size and drops them
DIRECT_BYTES = 16 << 20
#: receives of the pieces that land in place kept posted ahead of the one waited on
DIRECT_AHEAD = 4
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
    piece = max(1, min(int(chunk_bytes), DIRECT_BYTES))
    header = torch.from_numpy(np.frombuffer(_HEADER.pack(channel, kind, PIECES, nbytes, piece), dtype=np.uint8).copy())
    works = [pg.send([header], dst, HEADER_TAG)]
    for start, end in piece_bounds(nbytes, piece):
        works.append(pg.send([payload[start:end]], dst, HEADER_TAG))
    return works, [header, payload]


def piece_bounds(total: int, piece: int) -> Iterator[tuple[int, int]]:
    """Where each piece of a message in pieces starts and ends; its sender and its receiver both follow this.

    :data:`LEAD_PIECES` pieces of :data:`LEAD_BYTES` first, which land in the frames the receiver had posted
    before the header, then pieces of ``piece`` bytes, which land straight in the receiver's buffer.
    """
    start, count = 0, 0
    while start < total:
        end = min(total, start + (LEAD_BYTES if count < LEAD_PIECES else piece))
        yield start, end
        start, count = end, count + 1


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

    def __init__(
        self,
        pg: dist.ProcessGroup,
        peer: int,
        p2p_peer: int,
        max_recv_bytes: Callable[[], int | None],
        take_buffer: Callable[[int], np.ndarray],
    ):
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
        self._take_buffer = take_buffer  # a message's buffer, recycled: a fresh 64 MiB costs a page fault per 4 KiB
        # frames handed over with their message come back into service once the caller drops it
        self._frame_pool = BufferPool(FRAME_BYTES, max_buffers=HEADER_WINDOW + 4, huge_pages=False)
        # posted from the start: a sender's message goes out at once (see the module docstring);
        # (work, buffer, whether it is a frame: a piece's own receive is not posted again)
        self._frames: collections.deque[tuple[Any, np.ndarray, bool]] = collections.deque(
            self._post(self._frame_pool.take(FRAME_BYTES)) for _ in range(HEADER_WINDOW)
        )
        self._repost: list[np.ndarray] = []  # frames read, to post again before the next wait

    def _post(self, buffer: np.ndarray, frame: bool = True) -> tuple[Any, np.ndarray, bool]:
        return self._pg.recv([torch.from_numpy(buffer)], self._src, HEADER_TAG), buffer, frame

    def _next_frame(self, repost: bool = True) -> np.ndarray:
        """Wait for the next operation of the peer; a frame goes back into service at the next call with
        ``repost`` true (none during a message's pieces: see :meth:`_gather`)."""
        while repost and self._repost:  # frames read before (kept out of the caller's way until now)
            self._frames.append(self._post(self._repost.pop()))
        work, buffer, frame = self._frames.popleft()
        work.wait()
        if frame:
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
        for work, _, _ in self._frames:
            work.wait()
        self._frames.clear()
        self._repost.clear()
        self.closed = True

    def _payload(self, buffer: np.ndarray, channel: int, kind: int, mode: int, total: int, chunk: int) -> np.ndarray:
        """This message's payload, a numpy array the caller may keep."""
        if not 0 <= channel <= (1 << 31) or kind not in (0, 1):
            raise ProtocolError(f"header names channel {channel} and kind {kind}", sender=self.peer)
        limit = self._max_recv_bytes()
        over = limit is not None and total > limit
        if mode == INLINE and 0 <= total <= INLINE_BYTES:
            if over:  # read whole already: the peer's next message is in the next frame
                raise ProtocolError(f"message of {total} bytes is over the limit of {limit}", sender=self.peer)
            payload = buffer[HEADER_BYTES : HEADER_BYTES + total]
            if total < HAND_OVER_BYTES:
                return payload.copy()
            self._repost[-1] = self._frame_pool.take(FRAME_BYTES)  # this frame goes with the payload
            return payload
        if mode == PIECES and total > INLINE_BYTES and 0 < chunk <= DIRECT_BYTES:
            gathered = self._gather(total, chunk, over)
            if gathered is None:
                raise ProtocolError(f"message of {total} bytes is over the limit of {limit}", sender=self.peer)
            return gathered
        raise ProtocolError(f"header claims {total} bytes in mode {mode} (pieces of {chunk})", sender=self.peer)

    def _gather(self, total: int, chunk: int, over: bool) -> np.ndarray | None:
        """A message in pieces, into one buffer (None when ``over`` the limit: every piece is read and dropped,
        so the peer's next message is found where it starts).

        The first pieces land in the frames posted before the header (:func:`piece_bounds` keeps them small)
        and are copied out. The receives of the others go into the buffer itself, :data:`DIRECT_AHEAD` of them
        posted ahead, and no frame is posted again before the last of them: every operation of the peer lands
        where it belongs.
        """
        payload = None if over else self._take_buffer(total)
        scratch = np.empty(min(total, chunk), dtype=np.uint8) if over else None  # where dropped pieces land
        pieces = piece_bounds(total, chunk)
        lead = list(itertools.islice(pieces, len(self._frames)))  # the peer's next operations land in these

        def post_next() -> None:
            start, end = next(pieces, (0, 0))
            if end:
                target = payload[start:end] if payload is not None else scratch[: end - start]  # type: ignore[index]
                self._frames.append(self._post(target, frame=False))

        for _ in range(DIRECT_AHEAD):
            post_next()
        for start, end in lead:
            piece = self._next_frame(repost=False)
            if payload is not None:
                payload[start:end] = piece[: end - start]
        while self._frames and not self._frames[0][2]:  # the pieces received in place, in order
            self._next_frame(repost=False)
            post_next()
        return payload


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
