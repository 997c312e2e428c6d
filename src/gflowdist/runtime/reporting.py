"""What a rank tells the collector (metrics, checkpoint parts, its final report) and its trace's instants.

On the collector's own rank the same calls go to the
:class:`~gflowdist.runtime.collector.Collector` it hosts (:meth:`Reporting.host`):
a loop never asks whether it runs on the collector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gflowdist.context import DistributedContext
from gflowdist.runtime import protocol
from gflowdist.runtime.channels import Channels
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.protocol import Outgoing
from gflowdist.timing import StepTimer

if TYPE_CHECKING:
    from gflowdist.runtime.checkpoints import CheckpointSaver
    from gflowdist.runtime.collector import Collector

__all__ = ["Reporting"]


class Reporting:
    """One rank's reports to the collector (or, on the collector, to the collector it hosts)."""

    def __init__(
        self,
        context: DistributedContext,
        collector: int,
        channels: Channels,
        ledger: Ledger,
        timer: StepTimer,
        saver: CheckpointSaver | None = None,
    ) -> None:
        self.context, self.channels, self.ledger, self.timer, self.saver = context, channels, ledger, timer, saver
        self.rank = context.world.rank
        self.collector = collector  # its rank
        self.hosted: Collector | None = None  # the collector, on its own rank (host)
        self.clock_offset = 0.0  # seconds from my clock to the collector's (trace.json; runtime.observing)

    def host(self, collector: Collector) -> None:
        """This rank is the collector's: its reports go to ``collector`` directly, and :meth:`tend` polls it."""
        self.hosted = collector

    def measured_offset(self, seconds: float) -> None:
        """My clock's offset to the collector's, measured at the start (``run.trace``)."""
        self.clock_offset = seconds

    def note(self, event: str, category: str, **args: Any) -> None:
        """An instant ``event`` on my trace (a checkpoint, a fault); nothing without ``run.trace``."""
        if self.timer.trace is not None:
            self.timer.trace.instant(event, category, args)

    def report(self, message: Outgoing) -> None:
        """Send ``message`` (a :mod:`~gflowdist.runtime.protocol` constructor's) to the collector, unless I am it."""
        if self.rank != self.collector:
            self.channels.control.isend(*message, self.collector)

    def metrics(self, metrics: dict[str, Any]) -> None:
        """A row of metrics.jsonl from me."""
        if self.hosted is not None:
            self.hosted.record_metrics(self.rank, metrics)
        else:
            self.report(protocol.metrics(metrics))

    def tend(self, point: int) -> None:
        """On the collector's rank, at ``point`` (my step): hear the other ranks, write the progress line."""
        if self.hosted is not None:
            self.hosted.poll(point=point)
            self.hosted.progress()

    def checkpoint(self, name: str) -> dict[str, Any] | None:
        """Save my part of periodic checkpoint ``name``, tell the collector; returns the file's size and digest.

        None: checkpoints are off (no saver).
        """
        if self.saver is None:
            return None
        file = self.save_part(name)
        if self.hosted is not None:
            self.hosted.note_saved(name, self.rank, file)
        else:
            self.report(protocol.saved(name, file))
        return file

    def save_part(self, name: str) -> dict[str, Any]:
        """Save my part of checkpoint ``name`` (periodic or final) with my saver; once it is saved, an instant
        ``checkpoint`` (``args.name``) on my trace. Returns the file's size and digest."""
        if self.saver is None:
            raise RuntimeError(f"rank {self.rank} has no checkpoint saver for {name}")  # the job always gives one
        file = self.saver.save(name)
        self.note("checkpoint", "checkpoint", name=name)
        return file

    def final_dict(self, role: str, extra: dict[str, Any]) -> dict[str, Any]:
        """My final report as it stands (role, host, ledger, timers, clock offset, channel statistics, ``extra``;
        my trace with ``run.trace``): what :meth:`send_final` sends, and a post-mortem gathers."""
        final = {
            "role": role,
            "host": self.context.host,
            "ledger": self.ledger.to_dict(),
            "timing": self.timer.to_dict(),
            "clock_offset": self.clock_offset,
            "channels": {
                "data": self.channels.data.stats.to_dict(),
                "control": self.channels.control.stats.to_dict(),
                **(
                    {"inference": self.channels.inference.stats.to_dict()} if self.channels.inference.stats.sent else {}
                ),
            },
            **extra,
        }
        if self.timer.trace is not None:  # the collector writes it to trace.json, not to finals.json
            final["trace"] = self.timer.trace.to_dict()
        return final

    def send_final(self, role: str, extra: dict[str, Any]) -> dict[str, Any]:
        """My final report (:meth:`final_dict`) to the collector; returns it."""
        final = self.final_dict(role, extra)
        if self.rank != self.collector:
            self.channels.control.send(*protocol.final_report(final), self.collector)
        self.channels.control.drain()
        return final
