"""All-reduce of the ranks of one crowded machine through a shared mapping, woken by doorbells.

Where a job's ranks outnumber their machine's cores (:mod:`gflowdist.runtime.crowding`), a trainer that
reaches the gradient all-reduce first can do nothing useful until the last one arrives, and the last one
is often waiting for the core the early ones hold. MPI's shared-memory all-reduce moves the data in
several rounds, each of which needs the rank concerned to be polling: a rank that sleeps delays the
others, a rank that spins takes a core from them (gloo's goes through TCP on the loopback). Here each rank
has one event per call instead (for the groups of both engines: ``Communicator._host_reduce_for`` in
:mod:`gflowdist.comm.base`):

- it copies its array into its slot of a mapping the group shares (``/dev/shm``, unlinked once every
  rank has mapped it), one of two halves by the call's parity;
- it sends each peer a datagram naming the call (a *doorbell*: an ``AF_UNIX`` socket per rank in
  Linux's abstract namespace);
- it sleeps in ``poll`` on its own socket until every peer's datagram for this call has come (no spin,
  no timer: the last rank to arrive wakes the others), then reduces the slots in rank order, so every
  rank computes the same bits.

Two halves suffice: a rank writes call ``n + 1``'s half (that of call ``n - 1``) only after every peer
arrived at call ``n``, that is after each of them finished reading call ``n - 1``. A peer is at most one
call ahead, so at most ``2 * (size - 1)`` doorbells wait in a socket: groups larger than the kernel's
datagram queue allows (``net.unix.max_dgram_qlen``, 10 by default: 6 ranks) keep their engine's all-reduce.
The datagram is the record of arrival (a send blocks rather than drops), and the system calls on both
sides order the slot's bytes before it.
"""

from __future__ import annotations

import logging
import mmap
import os
import secrets
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from gflowdist.comm.machine import machine_key
from gflowdist.comm.polling import Backoff

if TYPE_CHECKING:
    from gflowdist.comm.base import Communicator

__all__ = [
    "HOST_MAX_BYTES",
    "HostReduce",
    "Doorbell",
    "datagram_queue_length",
    "fits_queue",
    "open_host_reduce",
    "reopen_host_reduce",
]

log = logging.getLogger(__name__)

_CALL = struct.Struct("<q")
#: larger arrays keep their engine's all-reduce: their time is moving bytes, not waking ranks, and each member would
#: map two slots of their size per rank
HOST_MAX_BYTES = 16 << 20
_REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}
#: slots are padded to this many bytes (every dtype's alignment)
_ALIGN = 64
SHM_DIR = Path("/dev/shm")


def datagram_queue_length() -> int:
    """How many datagrams an ``AF_UNIX`` socket queues before a sender blocks (Linux's default: 10)."""
    try:
        return int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    except (OSError, ValueError):
        return 10


def fits_queue(size: int) -> bool:
    """Whether a group of ``size`` ranks can use :class:`HostReduce` (see the module's docstring)."""
    return size > 1 and 2 * (size - 1) <= datagram_queue_length() and SHM_DIR.is_dir()


class Doorbell(Backoff):
    """A back-off that sleeps on a socket instead of a timer: it returns as soon as a datagram lands."""

    __slots__ = ("_poll",)

    def __init__(self, sock: socket.socket, slice_s: float = 0.05):
        super().__init__(spin_s=0.0, first_sleep_s=slice_s, max_sleep_s=slice_s)
        self._poll = select.poll()  # not select(): a descriptor above 1023 is fine
        self._poll.register(sock, select.POLLIN)

    def pause(self, deadline: float | None = None) -> None:
        delay = self.max_sleep_s
        if deadline is not None:
            delay = min(delay, max(deadline - time.monotonic(), 0.0))
        self._poll.poll(delay * 1e3)


class HostReduce:
    """The shared mapping and doorbells of one group (made collectively by :func:`open_host_reduce`)."""

    def __init__(self, rank: int, size: int, token: str, capacity: int):
        self.rank, self.size, self.capacity = rank, size, capacity
        path = SHM_DIR / f"gflowdist-reduce-{token}"
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 2 * size * capacity)
        finally:
            os.close(fd)
        self._memory = np.frombuffer(self._map, dtype=np.uint8)
        self._names = [f"\0gflowdist-reduce-{token}-{peer}".encode() for peer in range(size)]
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # blocking: a doorbell is never dropped
        try:
            self._socket.bind(self._names[rank])
        except OSError:
            self.close()
            raise
        self._socket.setblocking(False)  # read without waiting (the wait is the doorbell's poll)
        self._doorbell = Doorbell(self._socket)
        self._arrived: Counter[int] = Counter()
        self.calls = 0

    @staticmethod
    def create_segment(token: str, size: int, capacity: int) -> Path:
        """Make the mapping's file (one rank does this before the others open it)."""
        path = SHM_DIR / f"gflowdist-reduce-{token}"
        if len(path.name) > 63:
            raise OSError(f"segment name too long: {path.name}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            # reserved now, not on first touch: a tmpfs too small (a container's 64 MiB /dev/shm) refuses here
            # (ENOSPC: the group keeps its engine's all-reduce) instead of killing a rank with SIGBUS mid-call
            os.posix_fallocate(fd, 0, 2 * size * capacity)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return path

    @staticmethod
    def new_token() -> str:
        return f"{os.getpid()}-{secrets.token_hex(6)}"

    @staticmethod
    def capacity_for(nbytes: int) -> int:
        """A slot's bytes for an array of ``nbytes`` (room to grow: the next power of two, padded)."""
        return max(_ALIGN, 1 << (max(nbytes, 1) - 1).bit_length())

    def all_reduce(self, flat: np.ndarray, op: str, wait: Callable[[Callable[[], bool], Backoff], None]) -> None:
        """Reduce ``flat`` (1-D, contiguous, at most ``capacity`` bytes) in place with ``op`` (sum, max, min);
        ``wait(is_done, backoff)`` is the communicator's wait (deadline, keep-alive hook)."""
        call = self.calls
        half = (call & 1) * self.size * self.capacity
        mine = half + self.rank * self.capacity
        nbytes = flat.nbytes
        self._memory[mine : mine + nbytes] = flat.view(np.uint8)
        self.ring(call)
        if self._arrived[call] < self.size - 1:
            wait(lambda: self._drain(call), self._doorbell)
        del self._arrived[call]
        slots = self._memory[half : half + self.size * self.capacity].reshape(self.size, self.capacity)
        values = slots[:, :nbytes].view(flat.dtype)
        reduce = _REDUCE[op]
        np.copyto(flat, values[0])
        for peer in range(1, self.size):
            reduce(flat, values[peer], out=flat)
        self.calls = call + 1

    def ring(self, call: int) -> set[int]:
        """Tell every peer that I have arrived at ``call``; the peers whose doorbell is gone (their process
        ended: the wait goes on until the communicator's keep-alive hook hears of the loss, as MPI's would)."""
        message, gone = _CALL.pack(call), set()
        for peer in range(self.size):
            if peer != self.rank:
                try:
                    self._sender.sendto(message, self._names[peer])
                except (ConnectionRefusedError, FileNotFoundError):
                    gone.add(peer)
        return gone

    def _drain(self, call: int) -> bool:
        """Read every doorbell that has landed; whether all peers have arrived at ``call``."""
        while True:
            try:
                data = self._socket.recv(_CALL.size)
            except BlockingIOError:
                break
            self._arrived[_CALL.unpack(data)[0]] += 1
        return self._arrived[call] >= self.size - 1

    def close(self) -> None:
        """Close the sockets and unmap (idempotent)."""
        self._socket.close()
        self._sender.close()
        self._memory = np.empty(0, dtype=np.uint8)  # the mapping's last view, before the mapping closes
        try:
            self._map.close()
        except BufferError:  # a view still holds it (the frame of a call an error ended): unmapped with that view
            pass


def open_host_reduce(comm: Communicator, nbytes: int, *, first: bool = True) -> HostReduce | None:
    """Collective over ``comm`` (with its engine's own collectives): a :class:`HostReduce` for arrays up to
    ``nbytes``, or None (every member alike) where the mapping or a socket cannot be made. The group's first
    rank logs the opening (``first``; a mapping grown for a larger array at debug level)."""
    from gflowdist.comm.base import ReduceOp

    rank, size = comm.rank, comm.size
    capacity = HostReduce.capacity_for(nbytes)
    token = np.zeros(64, dtype=np.uint8)
    if rank == 0:
        name = HostReduce.new_token()
        try:
            HostReduce.create_segment(name, size, capacity)
            token[: len(name)] = np.frombuffer(name.encode(), dtype=np.uint8)
        except OSError as exc:
            log.warning("all_reduce stays with %s: no shared mapping in %s (%s)", comm.engine, SHM_DIR, exc)
    comm.broadcast(token, 0)
    name = token.tobytes().rstrip(b"\0").decode()
    if not name:
        return None
    host = None
    try:
        host = HostReduce(rank, size, name, capacity)
    except OSError as exc:
        log.warning("all_reduce stays with %s: rank %d cannot map or ring (%s)", comm.engine, rank, exc)
    agreed = comm.all_reduce(np.array([int(host is not None)], dtype=np.int64), ReduceOp.MIN)  # all mapped, bound
    if rank == 0:
        (SHM_DIR / f"gflowdist-reduce-{name}").unlink(missing_ok=True)
    if not agreed[0]:
        if host is not None:
            host.close()
        return None
    if rank == 0:
        log.log(
            logging.INFO if first else logging.DEBUG,
            "all_reduce of these %d ranks runs through shared memory (%d bytes a slot)",
            size,
            capacity,
        )
    return host


def reopen_host_reduce(
    comm: Communicator, host: HostReduce | None, nbytes: int, crowded: bool
) -> HostReduce | Literal[False]:
    """Collective over ``comm`` (every member calls it with the same ``nbytes``; the communicator must not
    route these collectives back here): its :class:`HostReduce` for an array of ``nbytes``, opened or grown
    here, or False where the group does not use one (decided once, with ``host`` None: every member must be
    ``crowded``, on this machine and in its network namespace, and the group small enough for
    :func:`fits_queue`)."""
    if host is None:
        mine = np.array([int(crowded and fits_queue(comm.size)), machine_key()], dtype=np.int64)
        every = np.stack([np.asarray(theirs) for theirs in comm.all_gather(mine)])
        if not (every[:, 0].all() and (every[:, 1] == mine[1]).all()):
            return False
    elif nbytes <= host.capacity:
        return host
    opened = open_host_reduce(comm, nbytes, first=host is None)
    if host is not None:
        host.close()
    return False if opened is None else opened
