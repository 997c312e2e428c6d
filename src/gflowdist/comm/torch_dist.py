"""The torch.distributed engine (gloo on CPU; nccl for CUDA tensor collectives).

Point-to-point framing (:mod:`gflowdist.comm.torch_p2p`): every message
starts with a header ``[channel tag, kind, mode, total bytes, chunk bytes]``;
a payload up to 1 MiB travels inside the header message (one gloo
operation), a larger one follows it in pieces received in place. Every operation uses one
wire tag and lands in the next receive posted for its sender, so neither
the framing nor ordering per (sender, channel) depends on tags (NCCL
ignores them). Byte
traffic always runs on a gloo group (created next to an nccl default group
when needed), so it works whatever backend the job's collectives use.

Gloo reports a point-to-point operation complete only from a blocking
``wait()`` (``is_completed()`` stays False, and a timed-out wait closes the
connection), so each communicator runs daemon threads: one receiver per peer,
which keeps receives posted for that peer and files whole messages into the
inbox, and a send-completion thread that waits on sends in order and marks
their handles. Callers wait on condition variables, never by polling: an idle
rank uses no CPU. The threads start with a rank's first point-to-point call
(or its ``free()``; a peer's send completes once a receive is posted): a
communicator used only for collectives (an agent group, a user's group handed
to a compat function) has none, and a user's ``destroy_process_group()``
leaves no thread blocked in gloo.

torch.distributed creates groups collectively over the *world*, so
:meth:`TorchComm.split` is available on the world communicator only; build
all sub-groups from it (as :class:`~gflowdist.context.DistributedContext` does).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gflowdist.comm.base import (
    AsyncSendHandle,
    CompletedSend,
    Inbox,
    check_groups,
    file_in_inbox,
    take_from_inbox,
)
from gflowdist.comm.buffers import BufferPool, as_byte_array, read_only_tensor
from gflowdist.comm.session import forget, register, track, unregister
from gflowdist.comm.torch_collectives import TorchCollectives
from gflowdist.comm.torch_p2p import CLOSE_CHANNEL, Lane, SendHandle, close_notices, post_message
from gflowdist.errors import DeadlineError, TransportError

__all__ = ["TorchComm"]

_UINT8 = torch.uint8
#: how long :meth:`TorchComm.free` waits for its peers to free too
FREE_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


class TorchComm(TorchCollectives):
    """A communicator over a torch.distributed process group (None: the default group).

    Its collectives are :class:`~gflowdist.comm.torch_collectives.TorchCollectives`'; this class adds
    the point-to-point traffic (receiver and send-completion threads) and the communicator's lifetime.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        p2p_group: dist.ProcessGroup | None = None,
        is_world: bool | None = None,
        chunk_bytes: int | None = None,
        max_recv_bytes: int | None = None,
    ):
        super().__init__(group, p2p_group=p2p_group, is_world=is_world)
        # send/recv travel in the gloo group of the collectives' ranks (_p2p_ranks number them there):
        # a user's sub-group carries its own, in its own ranks; the world's gloo group is WORLD
        self._pg = self._p2p if self._p2p is not None else dist.group.WORLD
        self._p2p_ranks = [self._group_to_p2p_rank(r) for r in range(self.size)]
        if chunk_bytes is not None:
            self.chunk_bytes = int(chunk_bytes)
        self.max_recv_bytes = max_recv_bytes
        self._inbox: Inbox = {}  # tag -> (sender, payload, kind), no empty queues
        self._inbox_bytes = 0
        #: the receiver threads stop receiving while this much is waiting unread, so a slow
        #: reader pushes back on its senders instead of buffering without bound
        self.max_inbox_bytes = 64 << 20
        self._arrived = threading.Condition()  # guards _inbox, _inbox_bytes and _receive_errors
        #: what the receiver threads failed on, oldest first: each is raised once, by the next receive
        self._receive_errors: collections.deque[BaseException] = collections.deque()
        self._lanes: dict[int, Lane] = {}  # peer -> what it sends us (torch_p2p)
        # the buffers of messages in pieces, for every lane (as many as MPIComm keeps), taken under the lock
        self._receive_pool = BufferPool()
        self._receive_pool_lock = threading.Lock()
        self._receivers: list[threading.Thread] = []
        self._send_lock = threading.Lock()
        self._sends: queue.SimpleQueue[SendHandle | None] = queue.SimpleQueue()
        self._completer: threading.Thread | None = None
        self._freed = False
        track(self)  # freed when its session closes, or at exit, if nobody frees it
        register(self, group if group is not None else dist.group.WORLD)  # found again from the group
        # receiver threads: from the first point-to-point call or free() (see the module docstring)
        self._receiving = False
        self._receivers_lock = threading.Lock()

    def split(self, groups: Sequence[Sequence[int]], *, backends: Sequence[str] | None = None) -> TorchComm | None:
        """A communicator over my group of ``groups``; ``backends``: each group's (default: the world's)."""
        if not self._is_world:
            raise NotImplementedError(
                "torch.distributed creates process groups collectively over the world: "
                "split the world communicator, not a sub-group"
            )
        groups = check_groups(groups, self.size)
        mine = None
        for i, members in enumerate(groups):  # every rank creates every group, in the same order
            backend = backends[i] if backends is not None else self.backend
            group = dist.new_group(members, backend=backend)
            p2p = group if backend == "gloo" else dist.new_group(members, backend="gloo")
            if self.rank in members:
                mine = (group, p2p)
        if mine is None:
            return None
        return TorchComm(
            mine[0], p2p_group=mine[1], is_world=False, chunk_bytes=self.chunk_bytes, max_recv_bytes=self.max_recv_bytes
        )

    # -- point to point ---------------------------------------------------------
    def _payload(self, data: Any, dst: int, tag: int, kind: int) -> torch.Tensor:
        """``data`` as a flat uint8 CPU tensor, after checking the arguments of a send."""
        self._check_send(dst, tag, kind)
        if (
            type(data) is torch.Tensor
            and data.dtype is _UINT8
            and data.ndim == 1
            and data.is_cpu
            and data.is_contiguous()
        ):
            return data
        return read_only_tensor(as_byte_array(data))

    def isend(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0) -> AsyncSendHandle:
        payload = self._payload(data, dst, tag, kind)
        if not self._receiving:
            self._ensure_receivers()
        if dst == self.rank:  # gloo has no connection to oneself: loop back through the inbox
            self._file(tag, dst, payload.clone(), kind)
            return CompletedSend(dst, tag, payload.numel())
        with self._send_lock:  # the parts of one message stay together
            works, buffers = post_message(self._open_pg(), self._p2p_ranks[dst], payload, tag, kind, self.chunk_bytes)
            handle = SendHandle(dst, tag, payload.numel(), works, buffers)
            self._ensure_completer()
            self._sends.put(handle)
        return handle

    def send(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0, timeout: float | None = None) -> None:
        """Blocking send without the completion thread (one thread hand-off less per message).

        Gloo queues a pair's sends in the order they are posted, so this send
        still follows any earlier ``isend`` on the wire.
        """
        if timeout is not None or dst == self.rank or self.wait_hook is not None:
            self.isend(data, dst, tag, kind=kind).wait(timeout)
            return
        payload = self._payload(data, dst, tag, kind)
        if not self._receiving:
            self._ensure_receivers()
        with self._send_lock:  # the parts of one message stay together
            works, _ = post_message(self._open_pg(), self._p2p_ranks[dst], payload, tag, kind, self.chunk_bytes)
        for work in works:
            work.wait()

    def try_recv_kind(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor, int] | None:
        self._check_peer(src, "src", allow_none=True)
        if not self._receiving:
            self._ensure_receivers()
        self._observe(src)
        with self._arrived:
            return self._take_queued(src, tag)

    def recv_kind(
        self, src: int | None = None, tag: int = 0, *, timeout: float | None = None
    ) -> tuple[int, torch.Tensor, int]:
        if src is not None and (type(src) is not int or not 0 <= src < self.size):
            self._check_peer(src, "src", allow_none=True)
        if not self._receiving:
            self._ensure_receivers()
        with self._arrived:
            found = self._take_queued(src, tag)
        if found is not None:  # the common case of a busy rank: no waiting at all
            return found
        lane = self._lanes.get(src) if src is not None else None
        if lane is not None and timeout is None and self.wait_hook is None:
            lane.last_direct = time.monotonic()  # keeps the lane's thread away (Lane.park)
            if lane.owner.acquire(blocking=False):
                try:
                    return self._recv_direct(lane, tag)
                finally:
                    lane.last_direct = time.monotonic()
                    lane.owner.release()
        else:
            self._observe(src)
        with self._arrived:
            return self._wait_queued(src, tag, timeout)

    def _recv_direct(self, lane: Lane, tag: int) -> tuple[int, torch.Tensor, int]:
        """Wait in gloo for ``lane``'s next message on ``tag`` (the caller owns the lane); file the others."""
        while True:
            with self._arrived:  # filed by the lane's thread before this caller took the lane over
                found = self._take_queued(lane.peer, tag)
            if found is not None:
                return found
            message = lane.next_message()
            if message is None:
                raise TransportError(
                    f"rank {lane.peer} freed the communicator while rank {self.rank} waited for "
                    f"a message from it on tag {tag}",
                    peer=lane.peer,
                )
            channel, payload, kind = message
            if channel == tag:
                return lane.peer, payload, kind
            self._file(channel, lane.peer, payload, kind)

    def _observe(self, src: int | None) -> None:
        """Have the lanes' threads watch ``src`` (None: every peer) now, without the park delay."""
        for peer, lane in self._lanes.items():
            if (src is None or peer == src) and lane.last_direct:
                lane.wake()

    def _wait_queued(self, src: int | None, tag: int, timeout: float | None) -> tuple[int, torch.Tensor, int]:
        """Wait on the inbox's condition (caller holds it) until a matching message is filed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self._take_queued(src, tag)
            if found is not None:
                return found
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                who = "any rank" if src is None else f"rank {src}"
                raise DeadlineError(f"receive on tag {tag} from {who}: nothing within {timeout:g} s", peer=src)
            # wake up now and then to run the keep-alive hook (outside the lock)
            slice_s = 0.25 if remaining is None else min(remaining, 0.25)
            if not self._arrived.wait(slice_s) and self.wait_hook is not None:
                self._arrived.release()
                try:
                    self.wait_hook()
                finally:
                    self._arrived.acquire()

    def _take_queued(self, src: int | None, tag: int) -> tuple[int, torch.Tensor, int] | None:
        """Pop the oldest matching message (caller holds ``_arrived``)."""
        if self._receive_errors:
            raise self._receive_errors.popleft()
        if not self._inbox:
            return None
        found = take_from_inbox(self._inbox, src, tag)
        if found is not None:
            self._inbox_bytes -= found[1].numel()
            if self._inbox_bytes < self.max_inbox_bytes:
                self._arrived.notify_all()  # a receiver thread may be waiting for room
        return found

    def _file(self, tag: int, sender: int, payload: torch.Tensor, kind: int) -> None:
        """Queue a received message and wake its readers (called by the receiver threads)."""
        with self._arrived:
            file_in_inbox(self._inbox, tag, (sender, payload, kind))
            self._inbox_bytes += payload.numel()
            self._arrived.notify_all()

    def _take_buffer(self, nbytes: int) -> np.ndarray:
        """A receive buffer of ``nbytes`` from the pool the lanes share (called by whichever thread holds a lane)."""
        with self._receive_pool_lock:
            return self._receive_pool.take(nbytes)

    def _wait_for_room(self) -> None:
        with self._arrived:
            self._arrived.wait_for(lambda: self._inbox_bytes < self.max_inbox_bytes or self._freed)

    def _fail(self, error: BaseException) -> None:
        with self._arrived:
            self._receive_errors.append(error)
            self._arrived.notify_all()

    def _send_close_notices(self) -> None:
        """What fills every receive each peer keeps posted for me, behind all I sent it (:meth:`free`)."""
        with self._send_lock:
            for peer in range(self.size):
                if peer == self.rank:
                    continue
                try:
                    works, buffers = close_notices(self._open_pg(), self._p2p_ranks[peer])
                except RuntimeError as exc:  # a broken pair: the receiver has stopped already
                    log.warning(
                        "rank %d: freeing the communicator: close notice to rank %d not sent: %s", self.rank, peer, exc
                    )
                    continue
                self._ensure_completer()
                self._sends.put(SendHandle(peer, CLOSE_CHANNEL, 0, works, buffers))

    def _ensure_receivers(self) -> None:
        """Start the receiver threads once (the first point-to-point call, or free())."""
        with self._receivers_lock:
            if not self._receiving and not self._freed:
                self._start_receivers()
                self._receiving = True

    def _start_receivers(self) -> None:
        """A lane per peer, each with receives posted for that peer and a thread serving it (torch_p2p)."""
        for peer in range(self.size):
            if peer == self.rank:
                continue
            lane = self._lanes[peer] = Lane(
                self._open_pg(), peer, self._p2p_ranks[peer], lambda: self.max_recv_bytes, self._take_buffer
            )
            deliver = lambda channel, payload, kind, peer=peer: self._file(channel, peer, payload, kind)  # noqa: E731
            thread = threading.Thread(
                target=lane.serve,
                args=(deliver, self._wait_for_room, self._fail),
                daemon=True,
                name=f"gflowdist-recv-{self.rank}-from-{peer}",
            )
            self._receivers.append(thread)
            thread.start()

    def _open_pg(self) -> dist.ProcessGroup:
        """The process group point-to-point messages travel in; refused once this communicator is freed."""
        if self._pg is None:
            raise TransportError(f"rank {self.rank}: point-to-point use of a freed communicator")
        return self._pg

    def _group_to_p2p_rank(self, rank: int) -> int:
        if self._p2p is self._group:
            return rank
        world = rank if self._group is None else dist.get_global_rank(self._group, rank)
        return world if self._p2p is None else dist.get_group_rank(self._p2p, world)

    def _ensure_completer(self) -> None:
        """Start the send-completion thread (caller holds ``_send_lock``)."""
        if self._completer is None:
            self._completer = threading.Thread(
                target=self._complete_sends, daemon=True, name=f"gflowdist-send-{self.rank}"
            )
            self._completer.start()

    def _complete_sends(self) -> None:
        """Send-completion thread: wait on sends in the order they were issued."""
        while True:
            handle = self._sends.get()
            if handle is None:
                return
            handle._complete()

    def free(self, timeout: float = FREE_TIMEOUT_S) -> None:
        """Collective, like ``MPI_Comm_free``: stop the helper threads once every peer frees too.

        Each rank sends every peer close notices behind all its earlier
        messages (as many as that peer keeps receives posted, so none is left
        posted on the group), so a receiver thread ends only after it has
        filed all that was sent to it. The caller waits up to ``timeout``
        seconds for the notices and for its own sends; a thread still blocked
        then (a peer that died, or never frees) is left behind and logged.
        Joining the threads matters: a daemon thread that leaves torch code
        while the interpreter shuts down aborts the process ("terminate called
        without an active exception").
        """
        if self._freed:
            return
        alive = self.size > 1 and dist.is_initialized()  # destroy_process_group() first: nobody to tell
        if alive:
            self._ensure_receivers()  # what peers sent here, and their close notices, are received
        self._freed = True
        forget(self)
        self._close_host_reduce()
        deadline = time.monotonic() + timeout
        if alive:
            self._send_close_notices()
        if self._completer is not None:
            self._sends.put(None)
        with self._arrived:
            self._arrived.notify_all()
        self._observe(None)
        threads = [self._completer, *self._receivers]
        for thread in threads:
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t is not None and t.is_alive()]
        if stuck:
            missing = [str(peer) for peer, lane in self._lanes.items() if not lane.closed]
            log.warning(
                "rank %d: freeing the communicator: %s still blocked after %g s (no close notice from rank(s) %s)",
                self.rank,
                ", ".join(stuck),
                timeout,
                ", ".join(missing) or "-",
            )
            return
        # Hold nothing of gloo's past this point: a process group (or a work) that the interpreter
        # destroys while it shuts down can abort the process, as one left undestroyed can (the
        # last reference to a group the user destroyed must go now, not at the interpreter's end).
        self._lanes, self._receivers, self._completer, self._pg = {}, [], None, None
        self._group = self._p2p = None
        unregister(self)
