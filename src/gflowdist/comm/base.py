"""The communicator protocol: one small interface, one class per engine.

Library code receives a :class:`Communicator` and never asks which engine is
behind it. Three implementations exist:

- :class:`~gflowdist.comm.local.LocalComm`: a world of one (no launcher);
- :class:`~gflowdist.comm.mpi.MPIComm`: mpi4py (MPICH, Open MPI, ...);
- :class:`~gflowdist.comm.torch_dist.TorchComm`: torch.distributed (gloo; nccl
  for CUDA tensor collectives).

Ranks are always ranks *of this communicator*: ``broadcast(x, src=0)`` on a
sub-group broadcasts from that group's first member on every engine.

Collectives take CPU tensors, CUDA tensors (torch engine: nccl) or numpy
arrays and work in place where that makes sense. Point-to-point messages are
bytes: ``send``/``isend`` take anything :func:`~gflowdist.comm.buffers.as_byte_array`
accepts, ``recv`` returns ``(source, uint8 tensor)``. Messages between one
pair of ranks on one tag arrive in the order they were sent, whatever their
size (messages above ``chunk_bytes`` are split and reassembled). Each message
also carries a one-bit *kind* the sender chooses (``kind=0`` or ``1``) and
:meth:`Communicator.recv_kind` reads back: it travels in the engine's framing
(the MPI wire tag, the gloo header), so a layer above can tell two formats apart
without wrapping the payload in an envelope.

Every blocking call takes ``timeout`` (seconds; None waits forever) and
raises :class:`~gflowdist.errors.DeadlineError` when it passes. Waiting polls
with back-off (:class:`~gflowdist.comm.polling.Backoff`), so an idle rank
sleeps instead of spinning a core.
"""

from __future__ import annotations

import collections
import enum
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from gflowdist.comm.host_reduce import HOST_MAX_BYTES, HostReduce, reopen_host_reduce
from gflowdist.comm.polling import Backoff, is_crowded, peer_wait, poll_until

__all__ = [
    "ReduceOp",
    "Communicator",
    "AsyncSendHandle",
    "CompletedSend",
    "MAX_TAG",
    "KINDS",
    "check_groups",
    "take_from_inbox",
    "file_in_inbox",
]

ArrayLike = TypeVar("ArrayLike", torch.Tensor, np.ndarray)

#: Largest user tag. Engines reserve the bits above it for their framing (MPI puts the tag,
#: the kind and a chunk bit in one wire tag, within the 32767 every MPI library allows).
MAX_TAG = (1 << 13) - 1
#: The kinds a message may have (see :meth:`Communicator.recv_kind`).
KINDS = (0, 1)

#: Default size of one wire chunk; larger payloads are split (MPI counts are 32-bit ints).
DEFAULT_CHUNK_BYTES = 1 << 30


class ReduceOp(enum.Enum):
    """Reductions of :meth:`Communicator.all_reduce`.

    ``AVG`` divides the sum by the size of the communicator it ran on (a
    sub-group's size on a sub-group, never the world's). It is defined for
    floating-point data only.
    """

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    AVG = "avg"


class AsyncSendHandle(ABC):
    """A send in flight, returned by :meth:`Communicator.isend`.

    The handle owns the send buffer until the send completes: modifying the
    data passed to ``isend`` before then is undefined, but dropping your own
    reference is safe.
    """

    dst: int
    tag: int
    nbytes: int

    @abstractmethod
    def is_complete(self) -> bool:
        """True once the buffer may be reused (test without blocking)."""

    def wait(self, timeout: float | None = None) -> None:
        """Block until complete; :class:`DeadlineError` names the destination after ``timeout``."""
        poll_until(
            lambda: True if self.is_complete() else None,
            timeout=timeout,
            what=f"send of {self.nbytes} bytes to rank {self.dst} (tag {self.tag})",
            peer=self.dst,
        )


class CompletedSend(AsyncSendHandle):
    """A send that was complete when it was issued (e.g. loopback)."""

    def __init__(self, dst: int, tag: int, nbytes: int):
        self.dst, self.tag, self.nbytes = dst, tag, nbytes

    def is_complete(self) -> bool:
        return True


def check_groups(groups: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Validate a split request: disjoint groups of ranks in ``range(size)``."""
    seen: set[int] = set()
    out = []
    for group in groups:
        members = [int(r) for r in group]
        if not members:
            raise ValueError("split: empty group")
        for r in members:
            if not 0 <= r < size:
                raise ValueError(f"split: rank {r} is outside this communicator of size {size}")
            if r in seen:
                raise ValueError(f"split: rank {r} appears in more than one group")
            seen.add(r)
        out.append(members)
    return out


class Communicator(ABC):
    """Rank, size, collectives, byte point-to-point and sub-groups of one group of ranks."""

    #: "local", "mpi" or "torch"
    engine: str = ""
    #: True when the ranks are threads of one process (:mod:`gflowdist.comm.threads`): signals, logs and the
    #: end of the process belong to the launcher's thread, not to each rank
    ranks_are_threads: bool = False
    rank: int
    size: int
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: The largest message a receive accepts (bytes; ``faults.max_message_bytes``): a bigger claimed size is
    #: refused before anything is allocated. None: no limit.
    max_recv_bytes: int | None = None
    #: Called now and then while a collective or receive waits for other ranks
    #: (the runtime sends heartbeats from it, so a rank blocked on a dead peer is
    #: not mistaken for the dead one). It may raise to abandon the wait. With a
    #: hook, collectives run as nonblocking operations polled with back-off
    #: (idle waiting sleeps); without one (and without a timeout) they use the
    #: engine's blocking call, the fastest path for large reductions.
    wait_hook: Callable[[], None] | None = None
    #: a crowded machine's all-reduce through shared memory (:mod:`gflowdist.comm.host_reduce`): None while
    #: undecided, False where this group does not use it (the engines that have it call ``_host_reduce_for``)
    _host: HostReduce | Literal[False] | None = None

    # -- identity ---------------------------------------------------------------
    @property
    def host(self) -> str:
        """Host name of this process (as the OS reports it)."""
        return socket.gethostname()

    def world_rank(self, rank: int) -> int:
        """The world rank of this communicator's ``rank`` (for messages naming a peer)."""
        return rank

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"

    # -- collectives ------------------------------------------------------------
    @abstractmethod
    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank of this communicator has entered the barrier."""

    @abstractmethod
    def all_reduce(self, x: ArrayLike, op: ReduceOp = ReduceOp.SUM, *, inplace: bool = True) -> ArrayLike:
        """Reduce ``x`` over the group. In place (returns ``x``) unless ``inplace=False``."""

    @abstractmethod
    def all_gather(self, x: ArrayLike) -> list[ArrayLike]:
        """Every rank's ``x`` (same shape and dtype on every rank), in rank order."""

    @abstractmethod
    def broadcast(self, x: ArrayLike, src: int = 0) -> ArrayLike:
        """Overwrite ``x`` on every rank with rank ``src``'s ``x`` (in place); returns ``x``."""

    @abstractmethod
    def gather(self, x: ArrayLike, dst: int = 0) -> list[ArrayLike] | None:
        """Every rank's ``x`` in rank order on ``dst``; None on the other ranks."""

    @abstractmethod
    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (any length), in rank order. For small control data."""

    @abstractmethod
    def split(self, groups: Sequence[Sequence[int]]) -> Communicator | None:
        """Collective over this communicator: a sub-communicator per group.

        ``groups`` are disjoint lists of this communicator's ranks, identical on
        every rank. Returns the communicator of the group holding this rank
        (ranks renumbered in the listed order), or None when no group does.
        """

    # -- point to point ---------------------------------------------------------
    @abstractmethod
    def isend(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0) -> AsyncSendHandle:
        """Start sending ``data`` (bytes-like) to ``dst``; returns at once.

        ``kind`` (0 or 1) travels with the message; :meth:`recv_kind` reads it back.
        """

    def send(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0, timeout: float | None = None) -> None:
        """Send ``data`` to ``dst`` and wait until its buffer may be reused."""
        self.isend(data, dst, tag, kind=kind).wait(timeout)

    @abstractmethod
    def try_recv_kind(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor, int] | None:
        """A waiting message from ``src`` (None: any source) on ``tag`` as ``(source, payload, kind)``, or None."""

    def try_recv(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor] | None:
        """A waiting message from ``src`` (None: any source) on ``tag``, or None at once."""
        found = self.try_recv_kind(src, tag)
        return None if found is None else (found[0], found[1])

    def recv(self, src: int | None = None, tag: int = 0, *, timeout: float | None = None) -> tuple[int, torch.Tensor]:
        """Receive one message: ``(source rank, uint8 tensor)``.

        Polls with back-off (calling :attr:`wait_hook` during long waits);
        raises :class:`DeadlineError` after ``timeout`` seconds without losing
        any message (a later call receives it).
        """
        source, payload, _ = self.recv_kind(src, tag, timeout=timeout)
        return source, payload

    def recv_kind(
        self, src: int | None = None, tag: int = 0, *, timeout: float | None = None
    ) -> tuple[int, torch.Tensor, int]:
        """As :meth:`recv`, and the kind the sender gave: ``(source rank, uint8 tensor, kind)``."""
        self._check_peer(src, "src", allow_none=True)
        who = "any rank" if src is None else f"rank {src}"
        found: list[tuple[int, torch.Tensor, int]] = []

        def arrived() -> bool:
            message = self.try_recv_kind(src, tag)
            if message is not None:
                found.append(message)
            return message is not None

        self._await(arrived, f"receive on tag {tag} from {who}", timeout=timeout, peer=src)
        return found[0]

    def _await(
        self,
        is_done: Callable[[], bool],
        what: str,
        nbytes: int = 0,
        timeout: float | None = None,
        peer: int | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """Wait for a nonblocking collective: spin about as long as it should take, then back off
        (``backoff``: another way to wait, e.g. a doorbell's).

        Calls :attr:`wait_hook` between checks once the spin phase is over.
        """
        if is_done():
            return
        hook = self.wait_hook
        backoff = peer_wait(nbytes) if backoff is None else backoff

        def check() -> bool | None:
            if is_done():
                return True
            if hook is not None and backoff.spinning_done():
                hook()
            return None

        poll_until(check, timeout=timeout, what=what, peer=peer, backoff=backoff)

    def _host_reduce_for(self, flat: np.ndarray) -> HostReduce | None:
        """The group's shared-memory all-reduce for the contiguous 1-D array ``flat``, opened or grown here
        (collective: every member calls it with the same array's shape and dtype), or None where it does not
        apply: numbers up to :data:`~gflowdist.comm.host_reduce.HOST_MAX_BYTES` of a group whose members are
        all crowded on one machine (decided at the group's first call)."""
        host = self._host
        if host is False or not 0 < flat.nbytes <= HOST_MAX_BYTES or flat.dtype.kind not in "fiu":
            return None
        if host is not None and flat.nbytes <= host.capacity:
            return host
        self._host = False  # the opening's own collectives go the engine's way
        self._host = reopen_host_reduce(self, host, flat.nbytes, is_crowded())
        return self._host or None

    def _reduce_on_host(self, host: HostReduce, flat: np.ndarray, op: ReduceOp) -> None:
        """``flat`` reduced in place with ``op`` through ``host`` (AVG: the sum; the caller divides)."""
        how = "max" if op is ReduceOp.MAX else "min" if op is ReduceOp.MIN else "sum"
        host.all_reduce(flat, how, lambda done, doorbell: self._await(done, "all_reduce", backoff=doorbell))

    def _close_host_reduce(self) -> None:
        if self._host:
            self._host.close()
        self._host = False

    # -- lifetime ---------------------------------------------------------------
    def free(self) -> None:
        """Release engine resources of this communicator (idempotent).

        Collective, like ``MPI_Comm_free``: every member calls it once it has
        finished with the communicator.
        """

    def abort(self, code: int = 1) -> None:
        """End the whole job now (every rank), with exit status ``code``."""
        raise SystemExit(code)

    def first_to_fail(self) -> bool:
        """Whether this rank is the one that reports the job's failure: True, except for ranks of one process
        (:mod:`gflowdist.comm.threads`), where only the first failing rank speaks and the others end silently."""
        return True

    # -- helpers for subclasses -------------------------------------------------
    def _check_peer(self, peer: int | None, name: str, *, allow_none: bool = False) -> None:
        if peer is None and allow_none:
            return
        if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < self.size:
            raise ValueError(f"{name}={peer!r} is not a rank of this communicator (size {self.size})")

    @staticmethod
    def _check_tag(tag: int, kind: int = 0) -> None:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) <= MAX_TAG:
            raise ValueError(f"tag must be an int in [0, {MAX_TAG}], got {tag!r}")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def _check_send(self, dst: Any, tag: Any, kind: Any) -> None:
        """Validate a send's arguments (the cheap test first: this runs on every message)."""
        if type(dst) is not int or not 0 <= dst < self.size:
            self._check_peer(dst, "dst")
        if type(tag) is not int or not 0 <= tag <= MAX_TAG or (kind != 0 and kind != 1):
            self._check_tag(tag, kind)


Inbox = dict[int, "collections.deque[tuple[int, torch.Tensor, int]]"]
"""Received messages by tag: ``tag -> deque of (sender, payload, kind)``."""


def file_in_inbox(inbox: Inbox, tag: int, entry: tuple[int, torch.Tensor, int]) -> None:
    """Queue a received ``(sender, payload, kind)`` under ``tag`` (the inbox holds no empty queues)."""
    queue = inbox.get(tag)
    if queue is None:
        inbox[tag] = queue = collections.deque()
    queue.append(entry)


def take_from_inbox(inbox: Inbox, src: int | None, tag: int) -> tuple[int, torch.Tensor, int] | None:
    """Pop the oldest ``(sender, payload, kind)`` queued under ``tag`` (from ``src``, or anyone); None if none."""
    queue = inbox.get(tag)
    if not queue:
        return None
    found = None
    if src is None:
        found = queue.popleft()
    else:
        for index, entry in enumerate(queue):
            if entry[0] == src:
                found = entry
                del queue[index]
                break
    if not queue:
        del inbox[tag]
    return found


def require_float_for_avg(x: Any) -> None:
    """AVG of integer data cannot be in place; refuse before any collective starts."""
    dtype = x.dtype
    is_float = dtype.is_floating_point if isinstance(x, torch.Tensor) else np.issubdtype(dtype, np.floating)
    if not is_float:
        raise TypeError(f"ReduceOp.AVG needs floating-point data, got {dtype}")
