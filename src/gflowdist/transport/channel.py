"""Typed messages between ranks: codec + byte transport + flow control + sequence checks.

A :class:`Channel` owns one tag of one communicator::

    ch = Channel(comm, tag=Tags.DATA, max_in_flight=8)
    ch.isend(MessageType.TRAJECTORIES, {"states": states}, dst=buffer_rank)
    msg = ch.recv(timeout=5.0)       # Message(type, sender, seq, body)

- **Encoded once.** ``isend`` encodes the message into one buffer
  (:func:`~gflowdist.transport.codec.encode`) and hands that buffer to the
  communicator; ``recv`` decodes with arrays viewing the received buffer.
- **Back-pressure.** At most ``max_in_flight`` sends per destination are
  outstanding; one more waits (up to ``send_timeout`` seconds, then
  :class:`~gflowdist.errors.DeadlineError` naming the destination) for the
  oldest to complete, so a slow receiver bounds the sender's memory instead of
  growing it.
- **Sequence numbers.** Each (channel, destination) pair numbers its messages
  0, 1, 2, ...; the receiver checks every sender's numbers and raises
  :class:`~gflowdist.errors.ProtocolError` on a gap or a duplicate, after
  which it resynchronises on the number it saw.
- **Bad input never crashes the receiver.** A malformed message raises
  ``ProtocolError`` naming the sender; the channel counts it in
  :attr:`Channel.stats` and the next ``recv`` serves the next message.
- **Both ends enforce one size limit.** ``max_message_bytes`` bounds the
  encoded message (prefix, header, padding and frames: the ``T`` of
  docs/wire-format.md) in both directions. The receiver refuses a bigger one
  with ``ProtocolError``; the sender refuses to send it: ``isend`` raises
  :class:`~gflowdist.transport.values.EncodeError` (a
  :class:`~gflowdist.errors.TransportError`, ``peer`` = the destination)
  naming the size, the limit, ``limit_name`` (where the limit comes from,
  e.g. the config key ``faults.max_message_bytes``), the message type and the
  destination. A message with array frames is refused before its buffer is
  allocated; nothing reaches the wire, and the sequence number and
  :attr:`Channel.stats` stay as they were. ``T <= max_message_bytes`` is
  accepted by both ends.

- **Observable.** An ``observer`` (:class:`ChannelObserver`, e.g. the
  runtime's timeline trace) hears of every message sent and taken, with its
  sequence number and when the call started; without one nothing is timed.

One channel per (communicator, tag): two channels on the same tag would
consume each other's messages and break the sequence checks.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from gflowdist.comm import AsyncSendHandle, Communicator
from gflowdist.comm.buffers import BufferPool
from gflowdist.errors import DeadlineError, ProtocolError
from gflowdist.transport.codec import DEFAULT_MAX_MESSAGE_BYTES, Message, MessageType, decode, encode
from gflowdist.transport.values import EncodeError

__all__ = ["Channel", "ChannelStats", "ChannelObserver"]


class ChannelObserver(Protocol):
    """Told of each message a :class:`Channel` sent or took (the runtime's trace implements it)."""

    clock: Callable[[], float]  # read when a send or receive call starts

    def sent(self, msg_type: MessageType, dst: int, tag: int, seq: int, started: float) -> None:
        """``isend`` started at ``started`` handed message ``seq`` to ``dst`` (it returns now)."""

    def took(self, message: Message, tag: int, started: float) -> None:
        """A receive call started at ``started`` returns ``message``."""


@dataclass
class ChannelStats:
    """Counters of one channel (plain ints, msgpack-able via :meth:`to_dict`)."""

    sent: int = 0
    received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    protocol_errors: dict[int, int] = field(default_factory=dict)
    sequence_errors: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "received": self.received,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "protocol_errors": {str(k): v for k, v in self.protocol_errors.items()},
            "sequence_errors": {str(k): v for k, v in self.sequence_errors.items()},
        }


class Channel:
    """Typed send / isend / recv on one tag of ``comm`` (see the module docstring)."""

    def __init__(
        self,
        comm: Communicator,
        tag: int = 0,
        *,
        max_in_flight: int = 8,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        send_timeout: float = 60.0,
        expected_types: Iterable[MessageType] | None = None,
        limit_name: str = "max_message_bytes",
    ):
        """``limit_name`` is what a refused sender is told to raise (the runtime passes its config key)."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {max_message_bytes}")
        self.comm = comm
        self.tag = tag
        self.max_in_flight = max_in_flight
        self.max_message_bytes = max_message_bytes
        self.limit_name = limit_name
        self.send_timeout = send_timeout
        self.expected_types = tuple(expected_types) if expected_types is not None else None
        self.stats = ChannelStats()
        self._next_seq: dict[int, int] = collections.defaultdict(int)
        self._expected_seq: dict[int, int] = {}
        self._pending: dict[int, collections.deque[AsyncSendHandle]] = collections.defaultdict(collections.deque)
        # Large messages are encoded into recycled buffers: a fresh multi-MiB array per message
        # costs a page fault per 4 KiB. A buffer returns to service once its send completed
        # (the handle drops it) and nothing else references it.
        self._send_buffers = BufferPool(max_buffers=max_in_flight + 2)
        self.observer: ChannelObserver | None = None

    # -- sending ----------------------------------------------------------------
    def isend(self, msg_type: MessageType, body: Any, dst: int, *, timeout: float | None = None) -> AsyncSendHandle:
        """Encode and start sending; waits only when ``max_in_flight`` sends to ``dst`` are pending.

        Raises :class:`~gflowdist.transport.values.EncodeError` (nothing sent)
        when the encoded message is over ``max_message_bytes``.
        """
        observer = self.observer
        started = observer.clock() if observer is not None else 0.0
        pending = self._pending[dst]
        self._retire(pending)
        if len(pending) >= self.max_in_flight:
            wait_s = self.send_timeout if timeout is None else timeout
            try:
                pending[0].wait(wait_s)
            except DeadlineError as err:
                raise DeadlineError(
                    f"back-pressure: {len(pending)} sends to rank {dst} still in flight after "
                    f"{wait_s:g} s (is it receiving?)",
                    peer=dst,
                ) from err
            self._retire(pending)
        seq = self._next_seq[dst]

        def alloc(nbytes: int) -> np.ndarray:  # a message with frames: refused before its buffer exists
            if nbytes > self.max_message_bytes:
                raise self._oversized(msg_type, nbytes, dst)
            return self._send_buffers.take(nbytes)

        buffer = encode(msg_type, body, sender=self.comm.rank, seq=seq, alloc=alloc)
        if buffer.nbytes > self.max_message_bytes:  # a frameless message: only its msgpack header
            raise self._oversized(msg_type, buffer.nbytes, dst)
        handle = self.comm.isend(buffer, dst, self.tag)
        self._next_seq[dst] = seq + 1
        self.stats.sent += 1
        self.stats.bytes_sent += buffer.nbytes
        pending.append(handle)
        if observer is not None:
            observer.sent(msg_type, dst, self.tag, seq, started)
        return handle

    def send(self, msg_type: MessageType, body: Any, dst: int, *, timeout: float | None = None) -> None:
        """Send and wait until the buffer is released (``timeout`` bounds both waits)."""
        self.isend(msg_type, body, dst, timeout=timeout).wait(self.send_timeout if timeout is None else timeout)

    def _oversized(self, msg_type: MessageType, nbytes: int, dst: int) -> EncodeError:
        kind = getattr(msg_type, "name", str(msg_type))
        return EncodeError(
            f"refusing to send a {nbytes}-byte {kind} message from rank {self.comm.rank} to rank {dst} "
            f"(tag {self.tag}): over the limit {self.limit_name} = {self.max_message_bytes} bytes, which "
            f"the receiver enforces too; nothing was sent. Raise {self.limit_name} to at least {nbytes}, "
            f"or send less per message",
            peer=dst,
        )

    @staticmethod
    def _retire(pending: collections.deque[Any]) -> None:
        while pending and pending[0].is_complete():
            pending.popleft()

    def in_flight(self, dst: int | None = None) -> int:
        """Sends not yet complete, to ``dst`` or to everyone."""
        queues = [self._pending[dst]] if dst is not None else list(self._pending.values())
        for q in queues:
            self._retire(q)
        return sum(len(q) for q in queues)

    def drain(self, timeout: float | None = None) -> None:
        """Wait for every pending send; :class:`DeadlineError` names a destination still pending."""
        wait_s = self.send_timeout if timeout is None else timeout
        for dst, pending in self._pending.items():
            while pending:
                try:
                    pending[0].wait(wait_s)
                except DeadlineError as err:
                    raise DeadlineError(
                        f"drain: {len(pending)} sends to rank {dst} did not complete within {wait_s:g} s", peer=dst
                    ) from err
                pending.popleft()

    def forget(self, dst: int) -> int:
        """Stop waiting for the pending sends to ``dst``, a rank that is gone; returns how many there were.

        They can never complete; :meth:`drain` would wait for them until its
        deadline. Their buffers stay referenced by the communicator's requests.
        """
        return len(self._pending.pop(dst, ()))

    def new_peer(self, rank: int) -> None:
        """Rank ``rank`` is a new process in place of a lost one (``faults.on_actor_loss: replace``): the
        messages each of us sends the other are numbered from 0 again."""
        self._pending.pop(rank, None)
        self._next_seq.pop(rank, None)
        self._expected_seq.pop(rank, None)

    # -- receiving --------------------------------------------------------------
    def try_recv(self, src: int | None = None, *, copy: bool = False) -> Message | None:
        """The next message if one has arrived, else None (never blocks)."""
        observer = self.observer
        started = observer.clock() if observer is not None else 0.0
        got = self.comm.try_recv(src, self.tag)
        if got is None:
            return None
        message = self._open(*got, copy=copy)
        if observer is not None:
            observer.took(message, self.tag, started)
        return message

    def recv(self, src: int | None = None, *, timeout: float | None = None, copy: bool = False) -> Message:
        """The next message (from ``src``, or any rank); DeadlineError after ``timeout``."""
        observer = self.observer
        started = observer.clock() if observer is not None else 0.0
        sender, payload = self.comm.recv(src, self.tag, timeout=timeout)
        message = self._open(sender, payload, copy=copy)
        if observer is not None:
            observer.took(message, self.tag, started)
        return message

    def _open(self, sender: int, payload: Any, *, copy: bool) -> Message:
        self.stats.bytes_received += int(payload.numel())
        try:
            message = decode(
                payload,
                sender=sender,
                max_message_bytes=self.max_message_bytes,
                copy=copy,
                expected_types=self.expected_types,
            )
        except ProtocolError:
            self.stats.protocol_errors[sender] = self.stats.protocol_errors.get(sender, 0) + 1
            raise
        expected = self._expected_seq.get(sender, 0)
        self._expected_seq[sender] = message.seq + 1
        if message.seq != expected:
            self.stats.sequence_errors[sender] = self.stats.sequence_errors.get(sender, 0) + 1
            kind = "duplicate or reordered" if message.seq < expected else f"{message.seq - expected} lost"
            raise ProtocolError(
                f"sequence number {message.seq}, expected {expected} ({kind}) on tag {self.tag}", sender=sender
            )
        self.stats.received += 1
        return message
