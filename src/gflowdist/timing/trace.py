"""A rank's timeline: what it did when, and each message it sent or took, kept in a ring of the newest events.

One :class:`TraceRecorder` per rank. Its :class:`~gflowdist.timing.timers.StepTimer`
puts every phase and collective in it as a duration event; the runtime adds
each message the rank sent or took (:meth:`TraceRecorder.message`) and
instants (a checkpoint saved, a malformed message refused, ...). Nothing here
talks to other ranks: at the end of a run the runtime gathers every rank's
:meth:`TraceRecorder.to_dict` and :mod:`gflowdist.timing.trace_file` writes
``trace.json``.

Bounded: the recorder keeps the newest ``capacity`` events (a ring; the
oldest go first) and counts the ones it let go. Timestamps are the rank's
``time.perf_counter()`` (the StepTimer's clock), in seconds; the file writer
moves them onto one time line.

Costs per event: one tuple appended to a ``collections.deque`` (plus, for a
message, one clock read before and after the transport call); no locks, no I/O.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping
from typing import Any

from gflowdist.errors import GflowdistError

__all__ = ["TraceRecorder", "TRACE_FORMAT", "SPAN", "INSTANT", "SENT", "TOOK"]

#: Version of :meth:`TraceRecorder.to_dict`'s layout.
TRACE_FORMAT = 1

#: Event kinds, the first field of every event in :meth:`TraceRecorder.to_dict`:
#: ``[SPAN, name, category, start, seconds, args]``
SPAN = 0
#: ``[INSTANT, name, category, time, args]``
INSTANT = 1
#: ``[SENT, message type, peer, tag, seq, start, seconds]``: a message this rank sent to ``peer``
SENT = 2
#: ``[TOOK, message type, peer, tag, seq, start, seconds]``: a message this rank took from ``peer``
TOOK = 3


class TraceRecorder:
    """The newest ``capacity`` events of one rank (module docstring).

    Args:
        capacity: events kept; older ones are dropped (and counted in :attr:`dropped`).
        clock: seconds, monotonic; the same clock as the rank's StepTimer.
    """

    __slots__ = ("events", "capacity", "recorded", "clock")

    def __init__(self, capacity: int = 20_000, *, clock: Callable[[], float] = time.perf_counter):
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise GflowdistError(f"trace capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self.events: collections.deque[tuple] = collections.deque(maxlen=capacity)
        self.recorded = 0
        self.clock = clock

    @property
    def dropped(self) -> int:
        """Events recorded but no longer kept (the ring's oldest)."""
        return self.recorded - len(self.events)

    def span(self, name: str, category: str, start: float, seconds: float,
             args: Mapping[str, Any] | None = None) -> None:
        """A duration event: ``name`` ran from ``start`` for ``seconds``."""
        self.events.append((SPAN, name, category, start, seconds, args))
        self.recorded += 1

    def instant(self, name: str, category: str, args: Mapping[str, Any] | None = None) -> None:
        """Something that happened now (a checkpoint saved, a fault noticed)."""
        self.events.append((INSTANT, name, category, self.clock(), args))
        self.recorded += 1

    def message(self, kind: int, message_type: str, peer: int, tag: int, seq: int, start: float,
                seconds: float) -> None:
        """A message sent to (``kind`` :data:`SENT`) or taken from (:data:`TOOK`) ``peer``.

        ``(tag, seq)`` is the channel's number of the message between the two
        ranks: the sender's and the receiver's events of one message carry the
        same, which is how the file writer draws an arrow from one to the other.
        """
        self.events.append((kind, message_type, peer, tag, seq, start, seconds))
        self.recorded += 1

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack- and JSON-able data: ``{"format", "capacity", "recorded", "events": [[...], ...]}``."""
        return {"format": TRACE_FORMAT, "capacity": self.capacity, "recorded": self.recorded,
                "events": [list(e) for e in self.events]}
