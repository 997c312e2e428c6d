"""What the role loops share: channels, the stop flag, liveness (heartbeats), the ledger, timers, the checkpoint saver,
the trace and the tape.

The channels and every message on them are in :mod:`gflowdist.runtime.protocol`.
Every choice a loop makes that depends on timing goes through :meth:`Wiring.take`,
:meth:`Wiring.stop_seen` and :meth:`Wiring.decide` (and :meth:`Wiring.check` a value
a replay must reproduce): the :mod:`~gflowdist.runtime.tape` records them
(``--record``) or makes them as recorded (``gflowdist replay``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gflowdist.comm import Communicator
from gflowdist.comm.polling import Backoff
from gflowdist.config import Config
from gflowdist.context import COMM_NAMES, DistributedContext
from gflowdist.errors import GflowdistError, PeerLostError
from gflowdist.layout import Layout, Role
from gflowdist.runtime import protocol
from gflowdist.runtime.failures import PostMortemCalled
from gflowdist.runtime.faults import on_refused
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.observing import TraceObserver
from gflowdist.runtime.protocol import Command, Outgoing, Tags
from gflowdist.runtime.settings import Settings
from gflowdist.runtime.tape import FREE, Site, Tape
from gflowdist.timing import StepTimer
from gflowdist.timing.trace import TraceRecorder
from gflowdist.transport import Message
from gflowdist.transport.channel import Channel

if TYPE_CHECKING:
    from gflowdist.runtime.checkpoints import CheckpointSaver

__all__ = ["Tags", "Wiring", "StopFlag", "LIMIT_KEY", "collector_rank"]

log = logging.getLogger("gflowdist.runtime")


#: The config key of the one message size limit (senders and receivers): named in the sender's refusal.
LIMIT_KEY = "faults.max_message_bytes"


class StopFlag:
    """Set by SIGINT/SIGTERM or by the coordinator's ``stop``; every loop checks it each step.

    With a ``trace`` (``run.trace``), the moment it is set is an instant event ``stop`` with the reason.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""
        self.trace: TraceRecorder | None = None

    def set(self, reason: str) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()
            if self.trace is not None:
                self.trace.instant("stop", "stop", {"reason": reason})

    def __bool__(self) -> bool:
        return self._event.is_set()

    def install_signal_handlers(self) -> None:
        def handler(signum, _frame):
            self.set(f"signal {signal.Signals(signum).name}")

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


#: Set when MPICH's hydra says a rank of the job died (SIGUSR1, caught only under
#: ``faults.on_actor_loss: continue``) until the collector names it: meanwhile nobody sends to an actor, since
#: a send to a dead rank stalls all of the sender's MPI traffic (MPICH 5) or fails (gloo).
PEER_DIED = threading.Event()
#: Set with :data:`PEER_DIED` and never cleared: this process heard of a death during the run.
DEATH_HEARD = threading.Event()

#: Ranks any wiring of this process went on without (``faults.on_actor_loss: continue``): the end of
#: such a process may not wait for them (see :func:`gflowdist.runtime.process.end_within`).
LOST_IN_THIS_PROCESS: set[int] = set()


def collector_rank(layout: Layout) -> int:
    """The rank that hears everyone: the coordinator, else rank 0 (a trainer)."""
    return layout.coordinator if layout.coordinator is not None else 0


@dataclass
class Wiring:
    """Everything a role loop needs besides its role object, built complete by :meth:`build`."""

    comm: Communicator  # the world
    context: DistributedContext
    config: Config
    settings: Settings  # what the loops read of the config, resolved once
    data: Channel  # the protocol's channels (gflowdist.runtime.protocol)
    control: Channel
    weights: Channel
    stop: StopFlag
    collector: int  # the rank that gathers reports: collector_rank()
    ledger: Ledger = field(default_factory=Ledger)
    generation: int = 0  # resumptions so far: names this run's checkpoints
    saver: CheckpointSaver | None = None  # saves this rank's part of a checkpoint (None: checkpoints off)
    timer: StepTimer = field(default_factory=StepTimer)
    tape: Tape = field(default_factory=Tape)  # records or replays this rank's choices (runtime.tape)
    clock_offset: float = 0.0  # seconds from my clock to the collector's (trace.json; runtime.observing)
    finished: set[int] = field(default_factory=set)  # ranks whose final report arrived (on the collector)
    _last_beat: float = field(default=0.0, init=False)
    _collector_seen: float = field(default_factory=time.monotonic, init=False)
    lost: dict[int, str] = field(default_factory=dict)  # actors the run goes on without (on_actor_loss)
    #: the trainer step each of my recent batches was made at, by its first trajectory's seq (refusals name it)
    shipped_at: dict[int, int] = field(default_factory=dict)
    refusals_heard: int = 0  # my buffer's refusals of my batches that reached me (hear_refusals)
    refused_here: set[int] = field(default_factory=set)  # seqs of my batches I refused myself (before a concat)
    #: on the collector, called while a collective waits (its poll; None while recording or replaying)
    on_wait: Callable[[], Any] | None = None

    @classmethod
    def build(
        cls,
        context: DistributedContext,
        config: Config,
        stop: StopFlag,
        *,
        ledger: Ledger | None = None,
        generation: int = 0,
        saver: CheckpointSaver | None = None,
        tape: Tape | None = None,
        trace: TraceRecorder | None = None,
    ) -> Wiring:
        """The channels on ``context``'s world, with ``ledger`` (a resumed run's) and ``generation``;
        ``tape`` records or replays the choices, ``trace`` gets every phase, collective and message."""
        comm = context.world
        # One limit at both ends: the communicator refuses a bigger claimed size before allocating,
        # each channel's decode refuses a bigger message, and each channel's isend refuses to send one
        # (its EncodeError names LIMIT_KEY), so an oversized message never reaches the wire.
        settings = Settings.of(config)
        limit = settings.max_message_bytes
        comm.max_recv_bytes = limit
        cap = settings.max_in_flight
        timeout = settings.send_timeout_s

        def channel(tag: int, max_in_flight: int) -> Channel:
            return Channel(
                comm,
                tag,
                max_in_flight=max_in_flight,
                max_message_bytes=limit,
                send_timeout=timeout,
                limit_name=LIMIT_KEY,
            )

        channels = {
            "data": channel(Tags.DATA, cap),
            "control": channel(Tags.CONTROL, 64),
            "weights": channel(Tags.WEIGHTS, 2),
        }
        if trace is not None:
            observer = TraceObserver(trace)
            for ch in channels.values():
                ch.observer = observer
            stop.trace = trace
        return cls(
            comm=comm,
            context=context,
            config=config,
            settings=settings,
            **channels,
            stop=stop,
            collector=collector_rank(context.layout),
            ledger=ledger if ledger is not None else Ledger(),
            generation=generation,
            saver=saver,
            timer=StepTimer(trace=trace),
            tape=tape or Tape(),
        )

    @property
    def rank(self) -> int:
        return self.comm.rank

    def heartbeat(self, step: int, **extra: Any) -> None:
        """Say I am alive, at most once per ``faults.heartbeat_s``.

        Ranks tell the collector; the collector tells every rank still running,
        so a lost collector is noticed too (:meth:`check_control`).
        """
        now = time.monotonic()
        if now - self._last_beat < self.settings.heartbeat_s:
            return
        self._last_beat = now
        if self.rank != self.collector:
            # what a lost actor's ledger is written from (gflowdist.runtime.lost_actors)
            counts = {"produced": self.ledger.produced} if self.ledger.produced else {}
            if self.ledger.received_from:
                counts["received_from"] = {str(k): v for k, v in self.ledger.received_from.items()}
            self.control.isend(*protocol.heartbeat(step, **counts, **extra), self.collector)
            return
        for rank in range(self.comm.size):
            if rank != self.rank and rank not in self.finished and self.may_send_to(rank):
                self.control.isend(*protocol.heartbeat(step), rank)

    def may_send_to(self, rank: int) -> bool:
        """False for a rank the run goes on without, and for every actor while a death is not yet named."""
        if rank in self.lost:
            return False
        return not (PEER_DIED.is_set() and self.context.layout.role_of(rank) is Role.ACTOR)

    def await_named_death(self) -> None:
        """Before a message every actor must get (a checkpoint marker, stop): wait until the dead rank is named."""
        deadline = time.monotonic() + self.settings.named_death_wait_s
        while PEER_DIED.is_set() and time.monotonic() < deadline:
            self.heartbeat(-1)
            self.check_control()
            time.sleep(0.01)

    def reset_liveness(self) -> None:
        """Start the liveness clocks now (after every rank finished its setup)."""
        self._collector_seen = time.monotonic()
        self._last_beat = 0.0

    def check_control(self) -> bool:
        """Read what the collector sent me (beats, ``stop``, ``lost``) and my buffer's refusals; True once the
        run should stop.

        Raises :class:`~gflowdist.errors.PeerLostError` naming the collector when
        it has been silent for longer than ``faults.peer_timeout_s``, and
        :class:`~gflowdist.errors.BadBatchError` when my buffer refused a batch
        of mine under ``faults.on_bad_batch: fail``.
        """
        if self.rank == self.collector:
            return bool(self.stop)
        now = time.monotonic()
        msg = self.control.try_recv(self.collector)
        while msg is not None:
            self._collector_seen = now
            self._obey(msg)
            msg = self.control.try_recv(self.collector)
        buffer = getattr(self.context.placement, "buffer", None)
        if buffer is not None and buffer != self.collector:
            msg = self.control.try_recv(buffer)
            while msg is not None:
                self._obey(msg)
                msg = self.control.try_recv(buffer)
        silent = now - self._collector_seen
        # an actor hears no beats while a death is not yet named (may_send_to): it allows twice the time
        settings = self.settings
        if silent > (settings.silence_after_death_s if PEER_DIED.is_set() else settings.collector_silence_s):
            layout = self.context.layout
            raise PeerLostError(
                self.collector,
                role=layout.role_of(self.collector).value,
                host=layout.host_of(self.collector),
                reason=f"no heartbeat for {silent:.1f} s (faults.peer_timeout_s = {settings.peer_timeout_s:g})",
            )
        return bool(self.stop)

    def _obey(self, msg) -> None:
        command = protocol.command_of(msg)
        if command is Command.STOP and not self.tape.replaying:  # replayed: stop_seen()
            self.stop.set(msg.body.get("reason", "coordinator"))
        elif command is Command.LOST:
            self.go_on_without(int(msg.body["rank"]), str(msg.body["reason"]))
        elif command is Command.REFUSED:
            self.refused(msg.body)
        elif command is Command.POSTMORTEM and not msg.body.get("written"):
            raise PostMortemCalled()

    def refused(self, body: Mapping[str, Any]) -> None:
        """My buffer refused my batch ``body["seq"]``: fail at the step that made it, or go on (on_bad_batch)."""
        self.refusals_heard += 1
        if body.get("seq") in self.refused_here:  # I refused it myself already (and went on: on_bad_batch drop)
            self.refused_here.discard(body.get("seq"))
            return
        self.note("batch refused", "fault", seq=body.get("seq"))
        on_refused(str(body["text"]), mode=self.settings.on_bad_batch, step=self.shipped_at.get(body.get("seq")))

    def hear_refusals(self, count: int) -> None:
        """Listen until I have heard ``count`` refusals from my buffer (a checkpoint's ack counts them; each
        was sent before it, on the control channel): under ``faults.on_bad_batch: fail`` the first raises."""
        backoff, deadline = Backoff(), time.monotonic() + self.settings.refusals_wait_s
        while self.refusals_heard < count:
            self.check_control()
            if self.refusals_heard >= count:
                return
            if time.monotonic() > deadline:
                raise GflowdistError(
                    f"my buffer refused {count} of my batches, but only {self.refusals_heard} "
                    f"refusals reached rank {self.rank} within faults.peer_timeout_s"
                )
            backoff.pause()

    def go_on_without(self, rank: int, reason: str) -> None:
        """Rank ``rank`` is lost and the run goes on (``faults.on_actor_loss: continue``): send it nothing more."""
        self.lost[rank] = reason
        self.note("rank lost", "fault", rank=rank, reason=reason)
        LOST_IN_THIS_PROCESS.add(rank)
        PEER_DIED.clear()  # named: sending to the other actors is safe again
        for channel in (self.data, self.control, self.weights):
            channel.forget(rank)
        log.warning("going on without rank %d: %s", rank, reason)

    def checkpoint(self, name: str) -> dict[str, Any] | None:
        """Save my part of periodic checkpoint ``name``, tell the collector; returns the file's size and digest.

        The collector's own part is noted by the collector itself
        (:meth:`Collector.note_saved`). None: checkpoints are off (no saver).
        """
        if self.saver is None:
            return None
        file = self.save_part(name)
        self.report(protocol.saved(name, file))
        return file

    def save_part(self, name: str) -> dict[str, Any]:
        """Save my part of checkpoint ``name`` (periodic or final) with my saver; once it is saved, an instant
        ``checkpoint`` (``args.name``) on my trace. Returns the file's size and digest."""
        file = self.saver.save(name)
        self.note("checkpoint", "checkpoint", name=name)
        return file

    def heartbeat_while_waiting(self) -> None:
        """While a collective waits (e.g. on a dead agent-group peer), keep heartbeating and listening.

        Without this a rank blocked on a dead peer falls silent too, and could be
        reported as the lost one.
        """
        for name in COMM_NAMES:
            comm = self.context.comm(name)
            if comm is not None:
                comm.wait_hook = self.keep_alive

    def keep_alive(self) -> None:
        """While waiting: heartbeat, and hear the collector; on the collector, :attr:`on_wait` (its poll, so
        that a failure elsewhere is heard while a collective waits for the failed rank)."""
        self.heartbeat(-1)
        if self.rank != self.collector:
            self.check_control()
        elif self.on_wait is not None:
            self.on_wait()

    # -- the choices (recorded with --record, made as recorded by gflowdist replay) -----------------
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
            site, channel, point, source=source, wait=wait, transparent=transparent, keep_alive=self.keep_alive
        )

    def stop_seen(self, point: int) -> bool:
        """Hear the collector; whether to stop before ``point`` (a step), as seen now or as recorded."""
        seen = self.check_control()
        decided, reason = self.tape.stop(point, seen, self.stop.reason)
        if decided and not self.stop:
            self.stop.set(reason)
        return decided

    def decide(self, site: Site, point: int, value: bool, who: int | None = None) -> bool:
        """A choice made by the clock (``value``; about rank ``who``, if given), or as recorded."""
        return self.tape.decide(site, point, value, who)

    def check(self, site: Site, point: int, value: Callable[[], Any]) -> None:
        """A value a replay must reproduce to the bit (``value()`` is only computed when recording or replaying)."""
        if self.tape.recording or self.tape.replaying:
            self.tape.check(site, point, value())

    def note(self, event: str, category: str, **args: Any) -> None:
        """An instant ``event`` on my trace (a checkpoint, a fault); nothing without ``run.trace``."""
        if self.timer.trace is not None:
            self.timer.trace.instant(event, category, args)

    def report(self, message: Outgoing) -> None:
        """Send ``message`` (a :mod:`~gflowdist.runtime.protocol` constructor's) to the collector, unless I am it."""
        if self.rank != self.collector:
            self.control.isend(*message, self.collector)

    def final_dict(self, role: str, extra: dict[str, Any]) -> dict[str, Any]:
        """My final report as it stands (role, host, ledger, timers, clock offset, channel statistics, ``extra``;
        my trace with ``run.trace``): what :meth:`send_final` sends, and a post-mortem gathers."""
        final = {
            "role": role,
            "host": self.context.host,
            "ledger": self.ledger.to_dict(),
            "timing": self.timer.to_dict(),
            "clock_offset": self.clock_offset,
            "channels": {"data": self.data.stats.to_dict(), "control": self.control.stats.to_dict()},
            **extra,
        }
        if self.timer.trace is not None:  # the collector writes it to trace.json, not to finals.json
            final["trace"] = self.timer.trace.to_dict()
        return final

    def send_final(self, role: str, extra: dict[str, Any]) -> dict[str, Any]:
        """My final report (:meth:`final_dict`) to the collector; returns it."""
        final = self.final_dict(role, extra)
        if self.rank != self.collector:
            self.control.send(*protocol.final_report(final), self.collector)
        self.control.drain()
        return final
