"""Liveness: the stop flag, heartbeats, what the collector tells every rank, the ranks the run goes on without.

:class:`Deaths` is what one rank's process heard of deaths (MPICH's hydra
signals one; the collector names it); :class:`Liveness` sends this rank's
heartbeats, reads the collector's (a silent collector is lost), obeys its
``stop``, ``lost`` and ``postmortem`` and my buffer's refusals of my batches
(:class:`Refusals`). The messages themselves are in :mod:`gflowdist.runtime.protocol`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gflowdist.comm.polling import Backoff
from gflowdist.context import COMM_NAMES, DistributedContext
from gflowdist.errors import GflowdistError, PeerLostError
from gflowdist.layout import Layout, Role
from gflowdist.runtime import protocol
from gflowdist.runtime.channels import Channels
from gflowdist.runtime.failures import PostMortemCalled
from gflowdist.runtime.faults import on_refused
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.protocol import Command
from gflowdist.runtime.settings import Settings
from gflowdist.timing.trace import TraceRecorder

if TYPE_CHECKING:
    from gflowdist.runtime.spares import Spares

__all__ = ["SignalFlag", "StopFlag", "Deaths", "Refusals", "Liveness", "collector_rank"]

log = logging.getLogger("gflowdist.runtime")

#: How many recent batches a trainer remembers the step of (a refusal arrives a few batches later at most).
SHIPPED_KEPT = 256


def collector_rank(layout: Layout) -> int:
    """The rank that hears everyone: the coordinator, else rank 0 (a trainer)."""
    return layout.coordinator if layout.coordinator is not None else 0


class SignalFlag:
    """A flag that a signal handler may set: plain attributes, no lock.

    A :class:`threading.Event` takes its condition's lock in ``set``; a second signal that arrives while
    the first one's handler is inside ``set`` runs its handler on the same thread, which then waits
    forever on that lock. Seen: hydra sent SIGUSR1 twice (an actor killed, then its replacement ended),
    and a buffer hung in ``Event.set`` inside its own handler until its peers named it lost.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


class StopFlag:
    """Set by SIGINT/SIGTERM or by the coordinator's ``stop``; every loop checks it each step.

    With a ``trace`` (``run.trace``), the moment it is set is an instant event ``stop`` with the reason
    (for a signal, the moment a loop first sees it: a handler only sets attributes, see :class:`SignalFlag`).
    """

    def __init__(self) -> None:
        self._flag = SignalFlag()
        self.reason = ""
        self.trace: TraceRecorder | None = None
        self._traced = False

    def set(self, reason: str) -> None:
        self._note(reason)
        self._trace_once()

    def _note(self, reason: str) -> None:
        if not self._flag.is_set():
            self.reason = reason
            self._flag.set()

    def _trace_once(self) -> None:
        if self._flag.is_set() and not self._traced and self.trace is not None:
            self._traced = True
            self.trace.instant("stop", "stop", {"reason": self.reason})

    def __bool__(self) -> bool:
        if self._flag.is_set() and not self._traced:
            self._trace_once()
        return self._flag.is_set()

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            self._note(f"signal {signal.Signals(signum).name}")  # attributes only (SignalFlag)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


class Deaths:
    """What this rank's process heard of deaths (``faults.on_actor_loss: continue``).

    ``unnamed`` is set when MPICH's hydra says a rank of the job died (SIGUSR1) until the collector names
    it: meanwhile nobody sends to an actor, since a send to a dead rank stalls all of the sender's MPI
    traffic (MPICH 5) or fails (gloo). ``heard`` is set with it and never cleared; ``heard_at`` is when the
    latest notice came (``time.monotonic``). ``lost``: the ranks gone on without; the end of such a process
    may not wait for them (:func:`gflowdist.runtime.process.end_within`). Both flags are :class:`SignalFlag`:
    the signal may come again while its handler runs.

    A notice with nothing left to name expires (:meth:`Liveness.death_unnamed`): hydra may say so again after
    the death was named (a killed actor's process and then its keeper; every host's proxy).
    """

    def __init__(self) -> None:
        self.unnamed = SignalFlag()
        self.heard = SignalFlag()
        self.heard_at = float("-inf")
        self.lost: set[int] = set()

    def signalled(self) -> None:
        """A rank died, not yet named (from a signal handler: attributes only)."""
        self.heard_at = time.monotonic()
        self.unnamed.set()
        self.heard.set()

    def named(self, rank: int) -> None:
        """The collector named the dead rank: sending to the other actors is safe again."""
        self.lost.add(rank)
        self.unnamed.clear()

    def spare_named(self) -> None:
        """The collector named an idle spare actor that fell silent (a process of the job, not a rank: its end
        makes hydra signal too): sending to the actors is safe again."""
        self.unnamed.clear()

    @property
    def any(self) -> bool:
        """A death was heard of, or a rank gone on without, during this process."""
        return bool(self.lost) or self.heard.is_set()


class Refusals:
    """My buffer's refusals of my batches: the step each recent batch was made at (and by which method),
    those heard, those I made."""

    def __init__(self) -> None:
        #: by the batch's first trajectory's seq: the trainer step that made it and the method that did
        #: (``"ToyTrainer.rollout"``); a refusal names both in the same words whether the buffer's refusal or the
        #: trainer's own check before its concat came first
        self.made: dict[int, tuple[int, str]] = {}
        self.heard = 0  # refusals that reached me (hear_refusals)
        self.mine: set[int] = set()  # seqs of my batches I refused myself (before a concat)

    def shipped(self, seq: int, step: int, made_by: str = "") -> None:
        """My batch ``seq`` was made at trainer step ``step`` by ``made_by`` (``"ToyTrainer.rollout"``;
        a refusal of it names both)."""
        self.made[seq] = (step, made_by)
        if len(self.made) > SHIPPED_KEPT:
            del self.made[next(iter(self.made))]

    def step_of(self, seq: int) -> int | None:
        """The trainer step that made my batch ``seq`` (None: not one of my recent batches)."""
        made = self.made.get(seq)
        return None if made is None else made[0]

    def origin_of(self, seq: int) -> str:
        """``"ToyTrainer.rollout made it at step 5"`` for my batch ``seq``; empty where that is not known."""
        step, made_by = self.made.get(seq, (0, ""))
        return f"{made_by} made it at step {step}" if made_by else ""

    def refuse_mine(self, seq: int, text: str, mode: str) -> None:
        """I refused my batch ``seq`` myself (before a concat; ``text``: the buffer's words): the buffer's refusal of
        it, when it comes, is not a second one. ``mode`` ``fail`` raises :class:`~gflowdist.errors.BadBatchError`
        at the step that made it, ``drop`` logs it."""
        self.mine.add(seq)
        self.answer(seq, text, mode)

    def is_news(self, seq: int | None) -> bool:
        """My buffer's refusal of my batch ``seq`` arrived (counted): False when I refused it myself already."""
        self.heard += 1
        if seq in self.mine:
            self.mine.discard(seq)
            return False
        return True

    def answer(self, seq: int | None, text: str, mode: str) -> None:
        """A refusal of my batch ``seq``, in ``text``: raise (``fail``) or log (``drop``), naming where the batch was
        made, in the same words whichever side saw it first (:func:`~gflowdist.runtime.faults.on_refused`)."""
        step = None if seq is None else self.step_of(seq)
        origin = "" if seq is None else self.origin_of(seq)
        on_refused(text, mode=mode, step=step, origin=origin)


class Liveness:
    """This rank's heartbeats and what it hears from the collector (and from its buffer) on the control channel."""

    def __init__(
        self,
        context: DistributedContext,
        channels: Channels,
        settings: Settings,
        stop: StopFlag,
        ledger: Ledger,
        deaths: Deaths,
        note: Callable[..., None],
        *,
        replaying: bool = False,
    ) -> None:
        self.context, self.channels, self.settings, self.stop = context, channels, settings, stop
        self.ledger, self.deaths, self.note, self.replaying = ledger, deaths, note, replaying
        self.comm = context.world
        self.rank = self.comm.rank
        self.collector = collector_rank(context.layout)
        self.lost: dict[int, str] = {}  # actors the run goes on without (on_actor_loss)
        self.finished: set[int] = set()  # ranks whose final report arrived (on the collector)
        self.refusals = Refusals()
        self._on_wait: Callable[[], Any] | None = None
        self._last_beat = 0.0
        self._collector_seen = time.monotonic()
        self.spares: Spares | None = None  # faults.on_actor_loss: replace (gflowdist.runtime.spares)
        # on the collector: replacements called but not heard from yet, rank -> its record (the Replacer's
        # ``pending``, gflowdist.runtime.replacing). They get no beats until their first one: a spare still
        # importing torch under load makes no MPI progress, and a beat every faults.heartbeat_s to it filled the
        # control channel's in-flight bound, which then failed the collector ("back-pressure ... is it
        # receiving?") although the replacement was only slow to start.
        self.starting: dict[int, Any] = {}
        #: on the collector's rank, its console line (``ProgressLine.say``): a notice of a death that expired
        #: (:meth:`death_unnamed`) is said there too, once for the job; elsewhere the rank's log has it
        self.say: Callable[[str], None] | None = None

    def heartbeat(self, step: int, **extra: Any) -> None:
        """Say I am alive, at most once per ``faults.heartbeat_s``.

        Ranks tell the collector; the collector tells every rank still running,
        so a lost collector is noticed too (:meth:`check_control`).
        """
        now = time.monotonic()
        if now - self._last_beat < self.settings.heartbeat_s:
            return
        self._last_beat = now
        control = self.channels.control
        if self.rank != self.collector:
            # what a lost actor's ledger is written from (gflowdist.runtime.lost_actors)
            counts: dict[str, Any] = {"produced": self.ledger.produced} if self.ledger.produced else {}
            if self.ledger.received_from:
                counts["received_from"] = {str(k): v for k, v in self.ledger.received_from.items()}
            control.isend(*protocol.heartbeat(step, **counts, **extra), self.collector)
            return
        for rank in range(self.comm.size):
            if rank != self.rank and rank not in self.finished and rank not in self.starting and self.may_send_to(rank):
                control.isend(*protocol.heartbeat(step), rank)

    def heard_final(self, rank: int) -> None:
        """On the collector: ``rank``'s final report arrived (it hears no more beats)."""
        self.finished.add(rank)

    def running_peers(self) -> list[int]:
        """On the collector: the other ranks still running (neither gone on without nor finished)."""
        return [r for r in range(self.comm.size) if r != self.rank and r not in self.lost and r not in self.finished]

    def may_send_to(self, rank: int) -> bool:
        """False for a rank the run goes on without, and for every actor while a death is not yet named."""
        if rank in self.lost:
            return False
        return not (self.death_unnamed() and self.context.layout.role_of(rank) is Role.ACTOR)

    def death_unnamed(self) -> bool:
        """Hydra said a process of the job died and the collector has not named a rank since.

        The collector names a dead rank within ``faults.peer_timeout_s`` of its last heartbeat. A notice that no
        naming followed within ``named_death_wait_s`` was about a death already named (hydra said it again: a
        killed rank's process and then its keeper end one after the other), or about a process that is not a
        rank's: it expires here, with a warning, and sending to the actors starts again. Before, such a notice
        held every trainer's weights back from its actors until the run's end, and nothing said so.

        A limit: under ``faults.on_actor_loss: replace``, a replacement that dies in its own start-up later than
        ``named_death_wait_s`` after a notice may be sent weights before it is named (a second fault inside the
        first). Its trainer's MPI traffic would then stall (MPICH 5), and the collector name that trainer lost for
        its silence: the job fails naming a rank, it does not hang. Not tried here.
        """
        if not self.deaths.unnamed.is_set():
            return False
        since = time.monotonic() - self.deaths.heard_at
        if since <= self.settings.named_death_wait_s:
            return True
        self.deaths.unnamed.clear()
        self.note("death notice expired", "fault", after_s=round(since, 1))
        text = (
            f"hydra said a process of this job ended {since:.1f} s ago, and the collector named no rank since "
            f"(it names a dead rank within faults.peer_timeout_s = {self.settings.peer_timeout_s:g} of its "
            "silence): taken as a notice about a death already named; sending to the actors again"
        )
        log.warning("%s", text)
        if self.say is not None:
            self.say(f"gflowdist: {text}")
        return False

    def await_named_death(self) -> None:
        """Before a message every actor must get (a checkpoint marker, stop): wait until the dead rank is named.

        Meanwhile keep alive as every wait does (:meth:`keep_alive`): on the collector that is its poll, which
        names the death and hears everyone's beats. Without it, a collector whose trainer waited here (hydra's
        notice of a death came again after the death was named, and nothing was left to name) heard nothing for
        ``named_death_wait_s`` and then named the buffer lost for a silence that was its own (seen once in CI)."""
        deadline = time.monotonic() + self.settings.named_death_wait_s
        while self.death_unnamed() and time.monotonic() < deadline:
            self.keep_alive()
            time.sleep(0.01)

    def reset(self) -> None:
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
        now, control = time.monotonic(), self.channels.control
        msg = control.try_recv(self.collector)
        while msg is not None:
            self._collector_seen = now
            self._obey(msg)
            msg = control.try_recv(self.collector)
        buffer = getattr(self.context.placement, "buffer", None)
        if buffer is not None and buffer != self.collector:
            msg = control.try_recv(buffer)
            while msg is not None:
                self._obey(msg)
                msg = control.try_recv(buffer)
        silent, settings = now - self._collector_seen, self.settings
        # an actor hears no beats while a death is not yet named (may_send_to), and the collector's notice may
        # expire after mine (death_unnamed): within silence_after_death_s of a notice it allows that long
        after_death = self.death_unnamed() or now - self.deaths.heard_at < settings.silence_after_death_s
        if silent > (settings.silence_after_death_s if after_death else settings.collector_silence_s):
            layout = self.context.layout
            raise PeerLostError(
                self.collector,
                role=layout.role_of(self.collector).value,
                host=layout.host_of(self.collector),
                reason=f"no heartbeat for {silent:.1f} s (faults.peer_timeout_s = {settings.peer_timeout_s:g})",
            )
        return bool(self.stop)

    def _obey(self, msg: Any) -> None:
        command = protocol.command_of(msg)
        if command is Command.STOP and not self.replaying:  # replayed: Choices.stop_seen()
            self.stop.set(msg.body.get("reason", "coordinator"))
        elif command is Command.LOST:
            self.go_on_without(int(msg.body["rank"]), str(msg.body["reason"]))
        elif command is Command.REPLACED:  # faults.on_actor_loss: replace (gflowdist.runtime.replacing)
            from gflowdist.runtime.replacing import adopt

            adopt(self, int(msg.body["rank"]), int(msg.body["spare"]))
        elif command is Command.SPARE_LOST:
            log.warning("the collector says: spare actor %d fell silent while idle", int(msg.body["spare"]) + 1)
            self.deaths.spare_named()
        elif command is Command.REFUSED:
            self.refused(msg.body)
        elif command is Command.POSTMORTEM and not msg.body.get("written"):
            raise PostMortemCalled()

    def refused(self, body: Mapping[str, Any]) -> None:
        """My buffer refused my batch ``body["seq"]``: fail at the step that made it, or go on (on_bad_batch)."""
        seq = body.get("seq")
        if self.refusals.is_news(seq):  # not one I refused myself already (and went on: on_bad_batch drop)
            self.note("batch refused", "fault", seq=seq)
            self.refusals.answer(seq, str(body["text"]), self.settings.on_bad_batch)

    def hear_refusals(self, count: int) -> None:
        """Listen until I have heard ``count`` refusals from my buffer (a checkpoint's ack counts them; each
        was sent before it, on the control channel): under ``faults.on_bad_batch: fail`` the first raises."""
        backoff, deadline = Backoff(), time.monotonic() + self.settings.refusals_wait_s
        while self.refusals.heard < count:
            self.check_control()
            if self.refusals.heard >= count:
                return
            if time.monotonic() > deadline:
                raise GflowdistError(
                    f"my buffer refused {count} of my batches, but only {self.refusals.heard} "
                    f"refusals reached rank {self.rank} within faults.peer_timeout_s"
                )
            backoff.pause()

    def go_on_without(self, rank: int, reason: str) -> None:
        """Rank ``rank`` is lost and the run goes on (``faults.on_actor_loss: continue``): send it nothing more."""
        self.lost[rank] = reason
        self.note("rank lost", "fault", rank=rank, reason=reason)
        self.deaths.named(rank)
        self.channels.forget(rank)
        log.warning("going on without rank %d: %s", rank, reason)

    def heartbeat_while_waiting(self) -> None:
        """While a collective waits (e.g. on a dead agent-group peer), keep heartbeating and listening.

        Without this a rank blocked on a dead peer falls silent too, and could be
        reported as the lost one.
        """
        for name in COMM_NAMES:
            comm = self.context.comm(name)
            if comm is not None:
                comm.wait_hook = self.keep_alive

    def poll_while_waiting(self, poll: Callable[[], Any]) -> None:
        """On the collector: while a collective waits, also ``poll`` (the collector's, so that a failure
        elsewhere is heard while a collective waits for the failed rank)."""
        self._on_wait = poll

    def keep_alive(self) -> None:
        """While waiting: heartbeat, and hear the collector (on the collector: its poll, if given)."""
        self.heartbeat(-1)
        if self.rank != self.collector:
            self.check_control()
        elif self._on_wait is not None:
            self._on_wait()
