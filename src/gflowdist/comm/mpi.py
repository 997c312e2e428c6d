"""The MPI engine (mpi4py).

Point-to-point framing: a message of at most ``chunk_bytes`` is one MPI
message on wire tag ``tag << 2 | kind << 1`` (:func:`~gflowdist.comm.mpi_wire.wire_tag`; the kind is the
one bit :meth:`~gflowdist.comm.base.Communicator.recv_kind` reads back). A
larger one is a sequence on that wire tag ``| 1``: an int64 total length, then
the chunks. The receiver
learns a message's size with a *matched* probe (``Improbe`` + ``Message.Recv``),
so two threads can never steal each other's message, and probes with
``ANY_TAG`` so the order of messages from one sender is kept whatever their
size; messages for other tags found on the way wait in an inbox.

Point-to-point traffic runs on a duplicate of the communicator, so it never
matches a user's own MPI receives or a collective.

A rank replaced by a process started with ``MPI_Comm_spawn``
(``faults.on_actor_loss: replace``, :mod:`gflowdist.runtime.replacing`) is
reached through the intercommunicator that spawn returned instead, with the
same framing: :meth:`MPIComm.route` sends to that rank there (at its rank in
the remote group) and probes there for messages from it; a stand-in process's
own communicator (:meth:`MPIComm.standing_in`) reaches each of its peers that
way, all through its one parent intercommunicator. Collectives never include
a replacement.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from mpi4py import MPI

from gflowdist.comm.base import (
    MAX_TAG,
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
from gflowdist.comm.buffers import BufferPool, as_byte_array
from gflowdist.comm.mpi_wire import CHUNKED as _CHUNKED
from gflowdist.comm.mpi_wire import KIND_SHIFT as _KIND_SHIFT
from gflowdist.comm.mpi_wire import TAG_SHIFT as _TAG_SHIFT
from gflowdist.comm.mpi_wire import MPISendHandle, drain_part, wire_tag
from gflowdist.comm.polling import poll_until
from gflowdist.comm.session import register
from gflowdist.comm.staging import like, numpy_view
from gflowdist.engines import MPI as MPI_ENGINE
from gflowdist.errors import ProtocolError

__all__ = ["MPIComm", "wire_tag"]

_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN, ReduceOp.AVG: MPI.SUM}
_UINT8 = torch.uint8
_U8 = np.dtype(np.uint8)
_new_bytes = np.empty
_ANY_SOURCE, _ANY_TAG, _BYTE = MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.BYTE
_fromaddress = MPI.buffer.fromaddress

#: :meth:`MPIComm.recv` polls this long in a tight loop before the general wait (see there)
RECV_SPIN_S = 200e-6
#: A receive that waits makes the array and tensor of the next message meanwhile, guessing the size of the last
#: one (a reply, a request of the same shape): up to this size, where latency is what counts. That takes 1.3-2.5
#: us (of the ~5 us a small message's receive adds to raw MPI here) off the path after the message landed.
READY_MAX_BYTES = 64 << 10


class MPIComm(Communicator):
    """A communicator over an mpi4py ``Comm`` (it is given, never ``COMM_WORLD`` implicitly)."""

    engine = MPI_ENGINE.name

    def __init__(self, comm: MPI.Comm, *, chunk_bytes: int | None = None, max_recv_bytes: int | None = None):
        self._comm = comm
        self._p2p = comm.Dup()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        if chunk_bytes is not None:
            self.chunk_bytes = int(chunk_bytes)
        #: a chunked message claiming more than this is refused before allocation
        self.max_recv_bytes = max_recv_bytes
        self._inbox: Inbox = {}  # tag -> (sender, payload, kind), no empty queues
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._pool = BufferPool()
        self._pool_min = self._pool.min_bytes  # smaller receives get a fresh array
        self._improbe = self._p2p.Improbe
        self._status = MPI.Status()
        #: made while a receive waits: an array of the size last received and its tensor, for the next small one
        self._ready: tuple[np.ndarray, torch.Tensor] | None = None
        self._last_small = 0  # bytes of the last message below the pool's sizes
        self._in_flight: list[MPISendHandle] = []  # keeps buffers alive if a caller drops a handle
        self._draining: dict[tuple[int, int], int] = {}  # (sender, wire tag) -> bytes of a refused message
        self._freed = False
        #: peers reached through an intercommunicator, at a rank of its remote group: replacements, or a stand-in's
        self._routes: dict[int, tuple[MPI.Comm, int]] = {}
        self._stand_in = False
        self._turn = 0  # where the next probe of the routed places starts (_try_routes)
        register(self, comm)  # found again from the mpi4py communicator

    @classmethod
    def standing_in(cls, rank: int, size: int, routes: dict[int, tuple[MPI.Comm, int]], **kwargs: Any) -> MPIComm:
        """The world of a process started in place of lost rank ``rank`` of a ``size``-rank job: it is ``rank``, and
        reaches each peer of ``routes`` (world rank -> intercommunicator, the peer's rank in its remote group)
        that way (no collectives)."""
        comm = cls(MPI.COMM_SELF, **kwargs)
        comm.rank, comm.size, comm._stand_in = rank, size, True
        for peer, (inter, remote) in routes.items():
            comm.route(peer, inter, remote)
        return comm

    def route(self, rank: int, inter: MPI.Comm, remote: int = 0) -> None:
        """From now on reach ``rank`` through intercommunicator ``inter``, where it is rank ``remote`` of the
        remote group, both ways."""
        self._routes[rank] = (inter, remote)

    @property
    def routed(self) -> tuple[int, ...]:
        """The ranks reached through an intercommunicator (:meth:`route`)."""
        return tuple(self._routes)

    @property
    def mpi_comm(self) -> MPI.Comm:
        """The underlying mpi4py communicator (for users' own MPI calls)."""
        return self._comm

    @property
    def host(self) -> str:
        return MPI.Get_processor_name()

    def world_rank(self, rank: int) -> int:
        if self._comm == MPI.COMM_WORLD or self._stand_in:
            return rank
        return self._comm.Get_group().Translate_ranks([rank], MPI.COMM_WORLD.Get_group())[0]

    # -- collectives ------------------------------------------------------------
    def barrier(self, timeout: float | None = None) -> None:
        request = self._comm.Ibarrier()
        self._await(request.Test, "barrier", timeout=timeout)

    def all_reduce(self, x: Any, op: ReduceOp = ReduceOp.SUM, *, inplace: bool = True) -> Any:
        if op is ReduceOp.AVG:
            require_float_for_avg(x)
        if not inplace:
            x = x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)
        array, write_back = numpy_view(x)
        flat = array.reshape(-1)
        host = self._host_reduce_for(flat) if self._host is not False else None  # gflowdist.comm.host_reduce
        if host is not None:
            self._reduce_on_host(host, flat, op)
        elif flat.size:
            if self.wait_hook is None:
                self._comm.Allreduce(MPI.IN_PLACE, flat, op=_OPS[op])
            else:
                request = self._comm.Iallreduce(MPI.IN_PLACE, flat, op=_OPS[op])
                self._await(request.Test, "all_reduce", flat.nbytes)
        if flat.size and op is ReduceOp.AVG:
            flat /= self.size
        write_back()
        return x

    def all_gather(self, x: Any) -> Any:
        array, _ = numpy_view(x)
        out = np.empty((self.size, *array.shape), dtype=array.dtype)
        if self.wait_hook is None:
            self._comm.Allgather(array.reshape(-1), out.reshape(self.size, -1))
        else:
            request = self._comm.Iallgather(array.reshape(-1), out.reshape(self.size, -1))
            self._await(request.Test, "all_gather", out.nbytes)
        return [like(x, out[i]) for i in range(self.size)]

    def broadcast(self, x: Any, src: int = 0) -> Any:
        self._check_peer(src, "src")
        array, write_back = numpy_view(x)
        if array.size and self.wait_hook is None:
            self._comm.Bcast(array.reshape(-1), root=src)
        elif array.size:
            request = self._comm.Ibcast(array.reshape(-1), root=src)
            self._await(request.Test, "broadcast", array.nbytes)
        write_back()
        return x

    def gather(self, x: Any, dst: int = 0) -> Any:
        self._check_peer(dst, "dst")
        array, _ = numpy_view(x)
        out = np.empty((self.size, *array.shape), dtype=array.dtype) if self.rank == dst else None
        request = self._comm.Igather(array.reshape(-1), None if out is None else out.reshape(self.size, -1), root=dst)
        self._await(request.Test, "gather", array.nbytes * self.size)
        return None if out is None else [like(x, out[i]) for i in range(self.size)]

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        payload = np.frombuffer(bytes(data), dtype=np.uint8)
        sizes = np.empty(self.size, dtype=np.int64)
        self._comm.Allgather(np.array([payload.size], dtype=np.int64), sizes)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._comm.Allgatherv(payload, [out, sizes.tolist(), offsets.tolist(), MPI.BYTE])
        return [out[o : o + s].tobytes() for o, s in zip(offsets, sizes, strict=False)]

    def split(self, groups: Sequence[Sequence[int]]) -> MPIComm | None:
        groups = check_groups(groups, self.size)
        color, key = MPI.UNDEFINED, 0
        for index, members in enumerate(groups):
            if self.rank in members:
                color, key = index, members.index(self.rank)
        sub = self._comm.Split(color, key)
        if sub == MPI.COMM_NULL:
            return None
        return MPIComm(sub, chunk_bytes=self.chunk_bytes, max_recv_bytes=self.max_recv_bytes)

    # -- point to point ---------------------------------------------------------
    def isend(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0) -> AsyncSendHandle:
        self._check_send(dst, tag, kind)
        payload = as_byte_array(data)
        nbytes = payload.nbytes
        if dst == self.rank:  # an MPI self-send completes only when received: loop back instead
            with self._recv_lock:
                file_in_inbox(self._inbox, tag, (dst, torch.from_numpy(payload.copy()), kind))
            return CompletedSend(dst, tag, nbytes)
        wire = wire_tag(tag, kind)
        p2p, to = self._routes[dst] if dst in self._routes else (self._p2p, dst)
        if nbytes <= self.chunk_bytes:
            request = p2p.Isend([payload, MPI.BYTE], to, wire)
            handle = MPISendHandle(dst, tag, nbytes, [request], [payload, data])
        else:
            header = np.array([nbytes], dtype=np.int64)
            with self._send_lock:  # the parts of one message must not interleave with another's
                requests = [p2p.Isend([header, MPI.BYTE], to, wire | _CHUNKED)]
                for start in range(0, nbytes, self.chunk_bytes):
                    part = payload[start : start + self.chunk_bytes]
                    requests.append(p2p.Isend([part, MPI.BYTE], to, wire | _CHUNKED))
            handle = MPISendHandle(dst, tag, nbytes, requests, [header, payload, data])
        if not handle.is_complete():
            if len(self._in_flight) >= 64:
                self._in_flight = [h for h in self._in_flight if not h.is_complete()]
            self._in_flight.append(handle)
        return handle

    #: messages up to this size go out with a blocking ``Send`` (MPI's eager path: no wait loop)
    eager_bytes = 64 << 10

    def send(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0, timeout: float | None = None) -> None:
        buffer: Any
        if type(data) is torch.Tensor and data.dtype is _UINT8 and data.is_cpu and data.is_contiguous():
            # read at the tensor's address (alive for this blocking call): no numpy view to build
            nbytes = data.nbytes
            buffer = _fromaddress(data.data_ptr(), nbytes) if nbytes else b""
        elif type(data) is bytes:
            buffer, nbytes = data, len(data)
        else:
            buffer = as_byte_array(data)
            nbytes = buffer.nbytes
        if not (
            type(dst) is int
            and 0 <= dst < self.size
            and type(tag) is int
            and 0 <= tag <= MAX_TAG
            and (kind == 0 or kind == 1)
        ):
            self._check_send(dst, tag, kind)  # raises, naming what is wrong (or accepts numpy integers)
        if nbytes <= self.eager_bytes and dst != self.rank and dst not in self._routes:  # small: one blocking Send
            self._p2p.Send([buffer, _BYTE], dst, (tag << _TAG_SHIFT) | (kind << _KIND_SHIFT))
        else:
            self.isend(data, dst, tag, kind=kind).wait(timeout)

    def recv_kind(
        self, src: int | None = None, tag: int = 0, *, timeout: float | None = None
    ) -> tuple[int, torch.Tensor, int]:
        found = self.try_recv_kind(src, tag)  # fast path: the message is already here
        if found is not None:
            return found
        if self._routes:  # routed peers: probe each place in turn (try_recv_kind) for a while, then the general wait
            spin_until = time.perf_counter() + (RECV_SPIN_S if timeout is None else min(RECV_SPIN_S, timeout))
            while time.perf_counter() < spin_until:
                found = self.try_recv_kind(src, tag)
                if found is not None:
                    return found
            return super().recv_kind(src, tag, timeout=timeout)
        # A reply that is on its way usually lands within microseconds: probe for it in a tight
        # loop first, then wait the general way (spin, back off, keep-alive hook, deadline).
        spin_until = time.perf_counter() + (RECV_SPIN_S if timeout is None else min(RECV_SPIN_S, timeout))
        probe, source, status = self._improbe, _ANY_SOURCE if src is None else src, MPI.Status()
        ready, expected = self._ready, self._last_small
        if expected <= READY_MAX_BYTES and (ready is None or ready[0].size != expected):
            array = _new_bytes(expected, _U8)  # while the message is on its way rather than after it came
            self._ready = (array, torch.from_numpy(array))
        while time.perf_counter() < spin_until:
            for _ in range(4):  # probes between clock reads: the reply is seen sooner after it lands
                message = probe(source, _ANY_TAG, status)
                if message is not None:
                    with self._recv_lock:
                        found = self._take(message, status, src, tag)
                    if found is not None:
                        return found
        return super().recv_kind(src, tag, timeout=timeout)

    def try_recv_kind(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor, int] | None:
        if src is not None and (type(src) is not int or not 0 <= src < self.size):
            self._check_peer(src, "src", allow_none=True)
        with self._recv_lock:
            if self._inbox:
                queued = take_from_inbox(self._inbox, src, tag)
                if queued is not None:
                    return queued
            status = self._status
            if self._routes and (src is None or src in self._routes):
                return self._try_routes(src, tag, status)
            while True:
                message = self._improbe(_ANY_SOURCE if src is None else src, _ANY_TAG, status)
                if message is None:
                    return None
                found = self._take(message, status, src, tag)
                if found is not None:
                    return found

    def _try_routes(self, src: int | None, tag: int, status: MPI.Status) -> tuple[int, torch.Tensor, int] | None:
        """:meth:`try_recv_kind` with routed peers (caller holds ``_recv_lock``): my communicator and each route, in
        turn, starting one further each call (a message found ends the call: a fixed order would starve the last)."""
        places: list[tuple[int | None, MPI.Comm, int]] = [
            (peer, inter, remote) for peer, (inter, remote) in self._routes.items() if src is None or peer == src
        ]
        if src is None and not self._stand_in:
            places.insert(0, (None, self._p2p, _ANY_SOURCE))
        if len(places) > 1:  # each call starts at the next place: a busy world never starves a routed peer
            self._turn = (self._turn + 1) % len(places)
            places = places[self._turn :] + places[: self._turn]
        for peer, p2p, source in places:
            while True:
                message = p2p.Improbe(source, _ANY_TAG, status)
                if message is None:
                    break
                found = self._take(message, status, src, tag, sender=peer, p2p=None if peer is None else p2p)
                if found is not None:
                    return found
        return None

    def _take(
        self,
        message: MPI.Message,
        status: MPI.Status,
        src: int | None,
        tag: int,
        *,
        sender: int | None = None,
        p2p: MPI.Comm | None = None,
    ) -> tuple[int, torch.Tensor, int] | None:
        """Receive a probed message (caller holds ``_recv_lock``): ``(sender, payload, kind)`` if it is
        the oldest one for ``(src, tag)``, else None (it waits in the inbox). ``sender``: the rank a routed
        message came from (:meth:`route`; its ``p2p`` intercommunicator)."""
        wire = status.Get_tag()
        if sender is None:
            sender = status.Get_source()
        if wire & _CHUNKED:
            if (sender, wire) in self._draining:
                drain_part(message, status, self._draining, sender, wire)  # a part of a refused message: discard
                return None
            payload = self._recv_chunked(message, status, sender, wire, p2p)
        else:
            count = status.Get_count(_BYTE)
            ready = self._ready
            if ready is not None and ready[0].size == count:  # made while this receive waited (recv_kind)
                self._ready = None
                message.Recv([ready[0], _BYTE])
                payload = ready[1]
            else:
                small = count < self._pool_min
                self._last_small = count if small else self._last_small
                buffer = _new_bytes(count, _U8) if small else self._pool.take(count)
                message.Recv([buffer, _BYTE])
                payload = torch.from_numpy(buffer)
        arrived = (sender, payload, (wire >> _KIND_SHIFT) & 1)
        if wire >> _TAG_SHIFT != tag or tag in self._inbox:
            # another tag's, or an earlier one of this tag may be queued (filed by another thread
            # between this caller's inbox check and its probe): queue it behind them
            file_in_inbox(self._inbox, wire >> _TAG_SHIFT, arrived)
            return take_from_inbox(self._inbox, src, tag)
        return arrived

    def _recv_chunked(
        self, message: MPI.Message, status: MPI.Status, sender: int, wire: int, p2p: MPI.Comm | None = None
    ) -> torch.Tensor:
        count = status.Get_count(MPI.BYTE)  # the probe's status: the caller's own when it probed outside the lock
        if count != 8:
            message.Recv([np.empty(count, dtype=np.uint8), MPI.BYTE])  # take it off the wire, then refuse
            raise ProtocolError(f"chunked message without an 8-byte length header ({count} bytes)", sender=sender)
        header = np.empty(1, dtype=np.int64)
        message.Recv([header, MPI.BYTE])
        total = int(header[0])
        too_big = self.max_recv_bytes is not None and total > self.max_recv_bytes
        if total < 0 or too_big:
            if total > 0:  # its parts are discarded as they arrive; nothing of that size is allocated
                self._draining[(sender, wire)] = total
            limit = f" (limit {self.max_recv_bytes})" if too_big else ""
            raise ProtocolError(f"chunked message claims {total} bytes{limit}", sender=sender)
        buffer = self._pool.take(total)
        offset = 0
        while offset < total:  # chunk sizes are the sender's: read what each part holds
            part = self._probe_from(sender, wire, p2p=p2p)
            count = self._status.Get_count(MPI.BYTE)
            if count == 0 or offset + count > total:
                part.Recv([np.empty(count, dtype=np.uint8), MPI.BYTE])
                raise ProtocolError(f"chunk of {count} bytes does not fit the announced {total}", sender=sender)
            part.Recv([buffer[offset : offset + count], MPI.BYTE])
            offset += count
        return torch.from_numpy(buffer)

    def _probe_from(self, sender: int, wire: int, timeout: float = 60.0, p2p: MPI.Comm | None = None) -> MPI.Message:
        source = sender if p2p is None else self._routes[sender][1]
        p2p = self._p2p if p2p is None else p2p
        return poll_until(
            lambda: p2p.Improbe(source, wire, self._status),
            timeout=timeout,
            what="next chunk of a chunked message",
            peer=sender,
        )

    # -- lifetime ---------------------------------------------------------------
    def free(self) -> None:
        if self._freed or MPI.Is_finalized():
            return
        self._freed = True
        self._close_host_reduce()
        self._p2p.Free()
        if self._comm not in (MPI.COMM_WORLD, MPI.COMM_SELF):
            self._comm.Free()

    def abort(self, code: int = 1) -> None:
        MPI.COMM_WORLD.Abort(code)
