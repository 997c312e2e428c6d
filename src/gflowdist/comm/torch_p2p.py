"""Point-to-point framing of the torch.distributed engine: one gloo operation per small message.

Every message starts with a header of five int64 words, ``[channel, kind, mode,
total bytes, chunk bytes]``, sent on wire tag ``HEADER_TAG``; ``mode`` says
where the payload is:

=========  ==============================================  ===========================
mode       payload                                         gloo operations
=========  ==============================================  ===========================
INLINE     up to ``INLINE_BYTES``, right behind the        1 (the payload is copied
           header in the same message                      behind the header)
DATA       up to ``DATA_BYTES``, one message on            2, no copy
           ``DATA_TAG``, sent before the header
CHUNKS     larger, in chunks of ``chunk bytes`` on         1 + chunks, no copy
           ``CHUNK_TAG``
=========  ==============================================  ===========================

A channel of :data:`CLOSE_CHANNEL` is the notice a peer sends when it frees
the communicator.

The receiving side keeps a :class:`Lane` per peer: ``HEADER_WINDOW`` header
receives and one ``DATA_BYTES`` data receive posted for that peer, so a
sender's message leaves at once. (Gloo holds a send back until the receiver
has announced a matching receive, one more message across and a wake-up of
the sender's gloo thread; an any-source receive announces nothing until a
send arrives.) Only CHUNKS payloads, above ``DATA_BYTES``, wait for that
announcement, once per chunk.

Gloo reports a receive complete only from a blocking ``wait()``, so each lane
has a thread that waits and files whole messages; a caller blocked in a
plain receive from one peer waits in gloo itself instead, which saves the
hand-off between threads on every message of a request/reply exchange (see
:class:`Lane`). :func:`close_notices` sends what fills every receive a peer
keeps posted, so no receive is left posted on the group once both sides have
freed.
"""

from __future__ import annotations

import collections
import struct
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

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

HEADER_TAG = 1 << 20
CHUNK_TAG = HEADER_TAG + 1
DATA_TAG = HEADER_TAG + 2
#: the channel of the notice a peer sends when it frees the communicator (user tags are >= 0)
CLOSE_CHANNEL = -1
INLINE, DATA, CHUNKS = 0, 1, 2
_HEADER = struct.Struct("<5q")
HEADER_BYTES = _HEADER.size
#: payloads up to this size travel inside the header message (copied once, one gloo operation)
INLINE_BYTES = 64 << 10
#: payloads up to this size land in a receive posted in advance (no handshake, no copy)
DATA_BYTES = 4 << 20
#: header receives each lane keeps posted for its peer
HEADER_WINDOW = 2
#: a lane's thread takes the lane back this long after the last direct receive from it
PARK_S = 0.002
_UINT8 = torch.uint8


def post_message(pg, dst: int, payload: torch.Tensor, channel: int, kind: int, chunk_bytes: int) -> tuple[list, list]:
    """Start sending one message to ``dst`` (a rank of ``pg``): ``(gloo works, buffers to keep)``.

    ``payload`` is a flat uint8 CPU tensor. The caller keeps the parts of one
    message together (a lock) and the buffers alive until every work completes.
    """
    nbytes = payload.numel()
    if nbytes <= INLINE_BYTES:
        envelope = np.empty(HEADER_BYTES + nbytes, dtype=np.uint8)
        _HEADER.pack_into(envelope, 0, channel, kind, INLINE, nbytes, 0)
        if nbytes:
            envelope[HEADER_BYTES:] = payload.numpy()
        message = torch.from_numpy(envelope)
        return [pg.send([message], dst, HEADER_TAG)], [message]
    mode = DATA if nbytes <= DATA_BYTES and nbytes <= chunk_bytes else CHUNKS
    header = torch.from_numpy(
        np.frombuffer(_HEADER.pack(channel, kind, mode, nbytes, chunk_bytes), dtype=np.uint8).copy()
    )
    if mode == DATA:  # the payload first: by the time its header lands, it has landed too (one wake-up)
        return [pg.send([payload], dst, DATA_TAG), pg.send([header], dst, HEADER_TAG)], [header, payload]
    works = [pg.send([header], dst, HEADER_TAG)]  # the receiver posts the chunks' receives once it reads this
    for start in range(0, nbytes, chunk_bytes):
        works.append(pg.send([payload[start : start + chunk_bytes]], dst, CHUNK_TAG))
    return works, [header, payload]


def close_notices(pg, dst: int) -> tuple[list, list]:
    """Start sending ``dst`` the close notices: one per header receive it keeps posted, and an empty data message."""
    notice = torch.from_numpy(np.frombuffer(_HEADER.pack(CLOSE_CHANNEL, 0, INLINE, 0, 0), dtype=np.uint8).copy())
    empty = torch.empty(0, dtype=_UINT8)
    works = [pg.send([notice], dst, HEADER_TAG) for _ in range(HEADER_WINDOW)]
    works.append(pg.send([empty], dst, DATA_TAG))
    return works, [notice, empty]


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

    def __init__(self, pg, peer: int, p2p_peer: int, max_recv_bytes: Callable[[], int | None]):
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
        # data receive buffers: one posted, one the reader holds, one spare; a buffer returns
        # to service once nothing references the payload that landed in it
        self._data_buffers = BufferPool(min_bytes=0, max_buffers=3)
        self._chunk_buffers = BufferPool(max_buffers=2)  # recycled: a fresh 64 MiB costs a page fault per 4 KiB
        # posted from the start: a sender's message goes out at once (see the module docstring)
        self._headers = collections.deque(
            self._post(np.empty(HEADER_BYTES + INLINE_BYTES, dtype=np.uint8), HEADER_TAG) for _ in range(HEADER_WINDOW)
        )
        self._data = self._post(self._data_buffers.take(DATA_BYTES), DATA_TAG)
        self._repost: list[np.ndarray] = []  # header buffers read, to post again before the next wait

    def _post(self, buffer: np.ndarray, tag: int):
        return self._pg.recv([torch.from_numpy(buffer)], self._src, tag), buffer

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
            while self._repost:  # header receives read last time (kept out of the caller's way until now)
                self._headers.append(self._post(self._repost.pop(), HEADER_TAG))
            work, buffer = self._headers.popleft()
            work.wait()
            channel, kind, mode, total, chunk = _HEADER.unpack_from(buffer, 0)
            if channel == CLOSE_CHANNEL:
                self._finish()
                return None
            self._repost.append(buffer)
            return channel, torch.from_numpy(self._payload(buffer, channel, kind, mode, total, chunk)), kind
        except RuntimeError as exc:  # the pair failed (peer gone, or closed by a timeout)
            self.failure = TransportError(f"receiving from rank {self.peer} failed: {exc}", peer=self.peer)
            raise self.failure from exc

    def serve(self, deliver: Callable, wait_for_room: Callable, fail: Callable) -> None:
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
        for work, _ in self._headers:
            work.wait()
        self._data[0].wait()
        self._headers.clear()
        self._data = None
        self.closed = True

    def _payload(self, buffer, channel, kind, mode, total, chunk) -> np.ndarray:
        """This message's payload, a numpy array the caller may keep."""
        if not 0 <= channel <= (1 << 31) or kind not in (0, 1):
            raise ProtocolError(f"header names channel {channel} and kind {kind}", sender=self.peer)
        if mode == INLINE and 0 <= total <= INLINE_BYTES:
            return buffer[HEADER_BYTES : HEADER_BYTES + total].copy()
        limit = self._max_recv_bytes()
        if mode == DATA and INLINE_BYTES < total <= DATA_BYTES:
            work, landed = self._data
            work.wait()  # posted in advance: the payload is in it or on its way
            self._data = self._post(self._data_buffers.take(DATA_BYTES), DATA_TAG)
            if limit is not None and total > limit:
                raise ProtocolError(f"message of {total} bytes is over the limit of {limit}", sender=self.peer)
            return landed[:total]
        if mode == CHUNKS and total >= 0 and chunk > 0 and (limit is None or total <= limit):
            payload = self._chunk_buffers.take(total)
            for start in range(0, total, chunk):
                self._pg.recv([torch.from_numpy(payload[start : start + chunk])], self._src, CHUNK_TAG).wait()
            return payload
        raise ProtocolError(
            f"header claims {total} bytes in mode {mode} (chunks of {chunk}, limit {limit})", sender=self.peer
        )


class SendHandle(AsyncSendHandle):
    """A send in flight: done when the send-completion thread has waited on every gloo work of it."""

    __slots__ = ("_buffers", "_done", "_error", "_works", "dst", "nbytes", "tag")

    def __init__(self, dst: int, tag: int, nbytes: int, works: list, buffers: list):
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
