"""A rank's timeline: what it did when, and each message it sent or took, kept in a ring of the newest events.

One :class:`TraceRecorder` per rank. Its :class:`~gflowdist.timing.timers.StepTimer`
puts every phase and collective in it as a duration event; the runtime adds
each message the rank sent or took (:meth:`TraceRecorder.message`) and
instants (a checkpoint saved, a malformed message refused, ...). Nothing here
talks to other ranks: at the end of a run the runtime gathers every rank's
:meth:`TraceRecorder.to_dict` and :mod:`gflowdist.timing.trace_file` writes
``trace.json``.

Bounded: the recorder keeps the newest ``capacity`` events (a ring; the
oldest go first) and counts the ones it let go. The ring is kept in the order
the events ended (an event is added when it ends; a time measured elsewhere
and recorded later, :meth:`TraceRecorder.stretch`, is put in its place).
Timestamps are the rank's ``time.perf_counter()`` (the StepTimer's clock), in
seconds; the file writer moves them onto one time line.

Costs per event: one tuple appended to a ``collections.deque`` (plus, for a
message, one clock read before and after the transport call); no locks, no I/O.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from gflowdist.errors import GflowdistError

__all__ = ["TraceRecorder", "TRACE_FORMAT", "SPAN", "INSTANT", "SENT", "TOOK", "span_seconds"]

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

#: The ``floor`` of :meth:`TraceRecorder.stretch` when no block is open around it.
NEVER = float("-inf")


class TraceRecorder:
    """The newest ``capacity`` events of one rank (module docstring).

    Args:
        capacity: events kept; older ones are dropped (and counted in :attr:`dropped`).
        clock: seconds, monotonic; the same clock as the rank's StepTimer.
    """

    __slots__ = ("capacity", "clock", "events", "recorded")

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

    def span(
        self, name: str, category: str, start: float, seconds: float, args: Mapping[str, Any] | None = None
    ) -> None:
        """A duration event: ``name`` ran from ``start`` for ``seconds``."""
        self.events.append((SPAN, name, category, start, seconds, args))
        self.recorded += 1

    def stretch(
        self,
        name: str,
        category: str,
        end: float,
        seconds: float,
        floor: float = NEVER,
        args: Mapping[str, Any] | None = None,
    ) -> int:
        """``seconds`` of ``name`` measured elsewhere and recorded when they ended, at ``end``; returns the
        number of duration events added.

        One event from ``end - seconds`` to ``end`` when that nests with the
        events already on the track (it lies inside, around or beside each of
        them) and starts after ``floor`` (the start of a block still open
        around this call, which will end after it). Otherwise, e.g. a rank's
        ``idle`` time summed over many polls whose stretch also holds a message
        it sent, the seconds are laid out going back from ``end`` in the track's
        free time, around every event there and not before ``floor``: several
        events of ``name``, each with ``args["stretch_s"]`` = ``seconds``, the
        same total (less what would fall before ``floor``).
        """
        start = end - seconds
        if seconds <= 0.0 or self._nests(start, end, floor):
            self._add_ended((SPAN, name, category, start, span_seconds(start, end), args), end)
            return 1
        pieces = self._free_time(end, seconds, floor)
        args = {**(args or {}), "stretch_s": seconds}
        for first, last in reversed(pieces):
            self._add_ended((SPAN, name, category, first, span_seconds(first, last), args), last)
        return len(pieces)

    def _nests(self, start: float, end: float, floor: float) -> bool:
        """Whether the event ``[start, end]`` nests with every event on the track and starts at or after ``floor``."""
        if start < floor < end:
            return False
        for event in reversed(self.events):  # by end, newest first
            first, last = _extent(event)
            if last <= start:
                return True  # this and every older event ended before it begins
            if first < start < last < end or start < first < end < last:
                return False  # cut through at its start or at its end
        return True

    def _free_time(self, end: float, seconds: float, floor: float) -> list[tuple[float, float]]:
        """``(start, end)`` pieces totalling ``seconds`` in the time before ``end`` that no event on the track
        covers, latest first, none before ``floor``."""
        pieces: list[tuple[float, float]] = []
        cursor, left = end, seconds
        for event in reversed(self.events):
            if cursor <= floor:
                break
            first, last = _extent(event)
            if event[0] == INSTANT or first >= cursor:
                continue  # no duration, or inside time already passed over
            if last <= cursor - left:
                break  # the rest fits before this event (and every older one)
            if last < cursor:
                pieces.append((max(last, floor), cursor))
                left -= cursor - pieces[-1][0]
            cursor = min(cursor, first)
        if left > 0.0 and cursor > floor:
            pieces.append((max(cursor - left, floor), cursor))
        return [(a, b) for a, b in pieces if b > a]

    def _add_ended(self, event: tuple, end: float) -> None:
        """Append ``event``, which ended at ``end``, keeping the ring in the order events ended."""
        self.recorded += 1
        events = self.events
        if not events or _extent(events[-1])[1] <= end:
            events.append(event)
            return
        at = len(events)
        while at > 0 and _extent(events[at - 1])[1] > end:
            at -= 1
        if len(events) == self.capacity:  # full: the oldest goes (which may be this one)
            if at == 0:
                return
            events.popleft()
            at -= 1
        events.insert(at, event)

    def instant(self, name: str, category: str, args: Mapping[str, Any] | None = None) -> None:
        """Something that happened now (a checkpoint saved, a fault noticed)."""
        self.events.append((INSTANT, name, category, self.clock(), args))
        self.recorded += 1

    def message(
        self, kind: int, message_type: str, peer: int, tag: int, seq: int, start: float, seconds: float
    ) -> None:
        """A message sent to (``kind`` :data:`SENT`) or taken from (:data:`TOOK`) ``peer``.

        ``(tag, seq)`` is the channel's number of the message between the two
        ranks: the sender's and the receiver's events of one message carry the
        same, which is how the file writer draws an arrow from one to the other.
        """
        self.events.append((kind, message_type, peer, tag, seq, start, seconds))
        self.recorded += 1

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack- and JSON-able data: ``{"format", "capacity", "recorded", "events": [[...], ...]}``."""
        return {
            "format": TRACE_FORMAT,
            "capacity": self.capacity,
            "recorded": self.recorded,
            "events": [list(e) for e in self.events],
        }


def span_seconds(start: float, end: float) -> float:
    """``end - start``, made such that ``start + seconds == end`` in floating point (differs by an ulp at most).

    The trace file computes an event's end as ``start + seconds``: an event
    recorded to end where another begins (or ends) then does exactly that,
    not a rounding error later, and the two still nest.
    """
    seconds = end - start
    for _ in range(4):
        total = start + seconds
        if total == end:
            break
        seconds = math.nextafter(seconds, -math.inf if total > end else math.inf)
    return seconds


def _extent(event: tuple) -> tuple[float, float]:
    """``(start, end)`` of an event of the ring (an instant: its time, twice)."""
    kind = event[0]
    if kind == SPAN:
        return event[3], event[3] + event[4]
    if kind == INSTANT:
        return event[3], event[3]
    return event[5], event[5] + event[6]
