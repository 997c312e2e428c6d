"""The choices a rank's loops make that depend on timing, through its tape (recorded with ``--record``, made as
recorded by ``gflowdist replay``): the facade the loops call, over :mod:`gflowdist.runtime.tape`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gflowdist.runtime.liveness import Liveness
from gflowdist.runtime.tape import FREE, Site, Tape
from gflowdist.transport import Message
from gflowdist.transport.channel import Channel

__all__ = ["Choices"]


class Choices:
    """Every timed choice of one rank: :meth:`take`, :meth:`stop_seen`, :meth:`decide`, and :meth:`check`
    a value a replay must reproduce."""

    def __init__(self, tape: Tape, liveness: Liveness) -> None:
        self.tape, self.liveness = tape, liveness

    def take(
        self,
        site: Site,
        channel: Channel,
        point: int = FREE,
        *,
        source: int | None = None,
        wait: bool = False,
        transparent: Callable[[Message], bool] | None = None,
    ) -> Message | None:
        """The next message on ``channel`` at ``site`` (:meth:`Tape.take <gflowdist.runtime.tape.Tape.take>`)."""
        return self.tape.take(
            site, channel, point, source=source, wait=wait, transparent=transparent, keep_alive=self.liveness.keep_alive
        )

    def stop_seen(self, point: int) -> bool:
        """Hear the collector; whether to stop before ``point`` (a step), as seen now or as recorded."""
        seen, stop = self.liveness.check_control(), self.liveness.stop
        decided, reason = self.tape.stop(point, seen, stop.reason)
        if decided and not stop:
            stop.set(reason)
        return decided

    def decide(self, site: Site, point: int, value: bool, who: int | None = None) -> bool:
        """A choice made by the clock (``value``; about rank ``who``, if given), or as recorded."""
        return self.tape.decide(site, point, value, who)

    def reached(self, point: int) -> None:
        """My loop is at ``point`` (a step) now: where a replay says a divergence happened."""
        self.tape.reached(point)

    def check(self, site: Site, point: int, value: Callable[[], Any]) -> None:
        """A value a replay must reproduce to the bit (``value()`` is only computed when recording or replaying)."""
        if self.tape.recording or self.tape.replaying:
            self.tape.check(site, point, value())
