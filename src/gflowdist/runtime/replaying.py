"""Replay: each of a rank's choices made as its recording says (:mod:`gflowdist.runtime.tape`).

The recorded events are followed in their order. A call at a site is served
by the next event when that event is the site's at this point; otherwise the
call finds nothing:

- a receive takes the recorded message: from the recorded sender (a
  sender's messages on one channel arrive in order), of the recorded type and
  sequence number. When it has not arrived yet, a loop that waits
  (``wait=True``: an actor's inbox, the collector on a trainer) waits for it;
  a free-running loop (a buffer's, the coordinator's) is told "nothing" and
  comes back. On the collector's channel, messages that arrive before their
  turn are kept aside (heartbeats, which are not choices, pass at once).
- a poll that found nothing in the recorded run finds nothing, even if a
  message is there: it stays for the call the recording gave it to.
- a stop is seen before the recorded step and at no other (a real signal
  still stops the replay, which then says it was interrupted).
- a timed choice (a buffer's summary; a trainer's weights not sent to an actor
  whose earlier weights were still in flight; an inference rank running the
  requests it gathered as one batch) is made where the recording made it.
- a check (a step's loss, a digest of shipped trajectories) must give the
  recorded value to the bit.

Anything else is a divergence: :class:`~gflowdist.errors.ReplayDivergence`
names the rank, where it was (step, iteration, trajectory, message) and the event, and
the job ends. A recorded message that does not come is one too: its sender
did something else. How long to wait for it: :data:`SLOWER` times as long as
the recorded run took from this rank's previous event to it (the events'
last field, in milliseconds), at least ``deadline_s`` (``faults.peer_timeout_s``).
"""

from __future__ import annotations

import collections
import struct
import time
from collections.abc import Callable
from typing import Any

from gflowdist.comm.polling import Backoff
from gflowdist.errors import ProtocolError, ReplayDivergence
from gflowdist.runtime.tape import FREE, MALFORMED, Site, Tape
from gflowdist.transport import Message, MessageType
from gflowdist.transport.channel import Channel

__all__ = ["ReplayTape", "describe_event"]

#: A replay may take this many times as long as the recorded run between two events of a rank.
SLOWER = 10.0
#: What a rank's points count, by role (for the divergence message); a BATCH check's point is a trajectory count.
UNITS = {"trainer": "step", "actor": "iteration", "buffer": "message", "coordinator": "message", "inference": "message"}


def describe_event(event: list[Any] | None) -> str:
    """An event in words: ``"DATA: TRAJECTORIES seq 3 from rank 4 (message 57)"``."""
    if event is None:
        return "nothing (the recording ends)"
    site, point = Site(event[0]), event[1]
    at = "" if point == FREE else f" at {point}"
    if site in (Site.DATA, Site.CONTROL, Site.INBOX, Site.INFER):
        kind = "a malformed message" if event[3] == MALFORMED else MessageType(event[3]).name
        seq = f" seq {event[4]}" if event[4] != -1 else ""
        return f"{site.name}: {kind}{seq} from rank {event[2]}{at}"
    if site is Site.STOP:
        return f"STOP{at} ({event[2]})"
    if site in (Site.LOSS, Site.BATCH):
        return f"{site.name} check{at}: {event[2]!r}"
    if site is Site.WEIGHTS:
        return f"WEIGHTS{at}: none sent to actor {event[2]} (its earlier weights in flight)"
    if site is Site.SERVE:
        return f"SERVE{at}: the requests gathered so far run as one batch"
    return f"{site.name}{at}"


def _same(a: Any, b: Any) -> bool:
    """Equal to the bit (floats by their bytes: NaN is NaN, -0.0 is not 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return bool(a == b)


class ReplayTape(Tape):
    """Follows one rank's recorded ``events`` (module docstring).

    Args:
        events: the recording's events, in order (:func:`~gflowdist.runtime.tape.read_recording`).
        rank: this rank, named by a divergence (with ``role`` and ``host``).
        role: this rank's role.
        host: this rank's host.
        deadline_s: how long a recorded message may be awaited.
    """

    replaying = True

    def __init__(self, events: list[list[Any]], *, rank: int, role: str, host: str, deadline_s: float):
        self.events = collections.deque(events)
        self.replayed = 0
        self.rank, self.role, self.host = rank, role, host
        self.deadline_s = deadline_s
        self.interrupted = False  # a real signal stopped the replay where the recording went on
        #: sender -> what it sent that the recording takes later (a message, or the error a malformed one raised)
        self._aside: dict[int, collections.deque[Message | ProtocolError]] = collections.defaultdict(collections.deque)
        self._progress_at = time.monotonic()  # when my previous event was replayed (or the tape opened)
        self._recorded_at = 0.0  # when the recorded run made that event (seconds since its tape opened)
        self._step: int | None = None  # the loop's latest point (step, iteration), named beside a trajectory count

    # -- the calls ------------------------------------------------------------------------
    def take(
        self,
        site: Site,
        channel: Channel,
        point: int = FREE,
        *,
        source: int | None = None,
        wait: bool = False,
        transparent: Callable[[Message], bool] | None = None,
        keep_alive: Callable[[], None] | None = None,
    ) -> Message | None:
        event = self._head(site, point)
        if event is None:
            return self._nothing(channel, transparent)
        backoff = Backoff()
        while True:
            msg = self._fetch(channel, event, transparent)
            if msg is not None:
                if transparent is not None and transparent(msg):
                    return msg
                self._verify(event, msg)
                self._advance()
                return msg
            self._still_awaited(event)
            if not wait:
                return None
            if keep_alive is not None:
                keep_alive()
            backoff.pause()

    def stop(self, point: int, seen: bool, reason: str) -> tuple[bool, str]:
        event = self._head(Site.STOP, point)
        if event is not None:
            self._advance()
            return True, event[2]
        if seen:  # a signal: the replay is stopped where the recorded run went on
            self.interrupted = True
        return seen, reason

    def decide(self, site: Site, point: int, value: bool, who: int | None = None) -> bool:
        event = self._head(site, point)
        if event is None or (who is not None and event[2] != who):
            return False
        self._advance()
        return True

    def check(self, site: Site, point: int, value: Any) -> None:
        event = self.events[0] if self.events else None
        unit = "trajectory" if site is Site.BATCH else None  # a BATCH check's point counts trajectories
        if site is not Site.BATCH:
            self._step = point
        if event is None or event[0] != site or event[1] != point:
            raise self._diverged(
                point,
                f"the replay reached the {site.name} check, where the recording has {describe_event(event)}",
                unit=unit,
            )
        if not _same(event[2], value):
            what = "loss" if site is Site.LOSS else "digest of the shipped trajectories"
            raise self._diverged(
                point,
                f"{site.name} check: the {what} is {value!r}, the recording's "
                f"{event[2]!r} (the computation differs: nondeterministic user code, "
                f"or changed files)",
                unit=unit,
            )
        self._advance()

    def reached(self, point: int) -> None:
        self._step = point

    def finish(self) -> None:
        if self.events and not self.interrupted:
            raise self._diverged(
                self.events[0][1],
                f"the rank's loop ended with {len(self.events)} recorded "
                f"events not replayed; the next: {describe_event(self.events[0])}",
            )

    # -- helpers --------------------------------------------------------------------------
    def _head(self, site: Site, point: int) -> list[Any] | None:
        """The next event if it is ``site``'s at ``point`` (FREE only at FREE: a loop not counted in steps)."""
        if point != FREE:
            self._step = point  # where the loop is (a trainer's step, an actor's iteration, ...)
        if not self.events:
            return None
        event = self.events[0]
        if event[0] != site:
            return None
        if event[1] != point:
            if FREE not in (point, event[1]) and event[1] < point:
                raise self._diverged(
                    point, f"the recording has {describe_event(event)}, which the replay passed without making"
                )
            return None
        return event

    def _advance(self) -> None:
        self._recorded_at = self.events.popleft()[-1] / 1e3
        self.replayed += 1
        self._progress_at = time.monotonic()

    def _nothing(self, channel: Channel, transparent: Callable[[Message], bool] | None) -> Message | None:
        """What a call finds when the recording gives it nothing now: a transparent message at most."""
        if transparent is None:
            return None
        for _ in range(64):
            msg = self._poll_any(channel)
            if msg is None or transparent(msg):
                return msg
            self._aside[msg.sender].append(msg)
        return None

    def _poll_any(self, channel: Channel) -> Message | None:
        while True:
            try:
                return channel.try_recv()
            except ProtocolError as err:  # its turn comes when the recording took it
                self._aside[-1 if err.sender is None else err.sender].append(err)

    def _fetch(
        self, channel: Channel, event: list[Any], transparent: Callable[[Message], bool] | None
    ) -> Message | None:
        """The recorded message of ``event`` if it is here (kept aside, or on the channel), else None."""
        sender = event[2]
        if transparent is None:  # a site that takes from one sender: ask for that sender's next message
            try:
                return channel.try_recv(sender)
            except ProtocolError as err:
                return self._malformed(event, err)
        if self._aside[sender]:
            item = self._aside[sender].popleft()
            return self._malformed(event, item) if isinstance(item, ProtocolError) else item
        for _ in range(64):
            msg = self._poll_any(channel)
            if msg is None or transparent(msg) or msg.sender == sender:
                return msg
            self._aside[msg.sender].append(msg)
        return None

    def _malformed(self, event: list[Any], err: ProtocolError) -> Message | None:
        if event[3] != MALFORMED:
            raise self._diverged(
                event[1], f"expected {describe_event(event)}, got a malformed message from rank {err.sender}: {err}"
            )
        self._advance()
        raise err

    def _verify(self, event: list[Any], msg: Message) -> None:
        if int(msg.type) != event[3] or (event[4] != -1 and msg.seq != event[4]):
            raise self._diverged(
                event[1], f"expected {describe_event(event)}, got {msg.type.name} seq {msg.seq} from rank {msg.sender}"
            )

    def _still_awaited(self, event: list[Any]) -> None:
        waited, took = time.monotonic() - self._progress_at, max(event[-1] / 1e3 - self._recorded_at, 0.0)
        if waited > max(self.deadline_s, SLOWER * took):
            raise self._diverged(
                event[1],
                f"waited {waited:.1f} s for {describe_event(event)} (the recorded run "
                f"took {took:.1f} s to it), which rank {event[2]} did not send: it "
                f"diverged first",
            )

    def _diverged(self, point: int, event: str, unit: str | None = None) -> ReplayDivergence:
        """``unit`` "trajectory": ``point`` counts trajectories; the loop's own point (its step) is added."""
        loop_unit = UNITS.get(self.role, "point")
        where = f"{unit or loop_unit} {point}" if point != FREE else f"recorded event {self.replayed + 1}"
        if unit is not None and self._step is not None:
            where += f" ({loop_unit} {self._step})"
        return ReplayDivergence(self.rank, role=self.role, host=self.host, where=where, event=event)
