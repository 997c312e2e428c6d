"""Replacing a lost actor (``faults.on_actor_loss: replace``): spare actors, the collector's side and its peers'.

The spare actors themselves, started at the job's start-up, and their
heartbeats while they wait, are :mod:`gflowdist.runtime.spares`.

When an actor falls silent for longer than ``faults.peer_timeout_s``, the
collector first goes on without it as under ``continue``
(:mod:`gflowdist.runtime.lost_actors`: its in-flight trajectories are dropped,
reason ``lost_rank``); then, while a spare is left and the job has replaced
fewer than ``faults.max_restarts`` actors, :class:`Replacer` makes the next
spare the lost rank, with no wait on anything:

1. it sends the spare the rank it stands in for, the layout and the run
   directory, and tells the lost actor's trainer and buffer which spare it is
   (:func:`protocol.replaced <gflowdist.runtime.protocol.replaced>`);
2. each of them reaches the rank through the spares' intercommunicator from
   then on (:func:`adopt`, :meth:`gflowdist.comm.mpi.MPIComm.route`),
   numbering its messages to and from it from 0 again; the buffer says how
   many trajectories it had received from the lost actor
   (:func:`protocol.adopted <gflowdist.runtime.protocol.adopted>`), which fixes
   the lost one's ledger;
3. the spare builds the actor role afresh, counts from zero, takes the next
   weights its trainer publishes (every ``sync.weights_to_actors_every``
   versions, to every live actor), and ships to its buffer; its final report reaches the collector like any
   other, and :meth:`Replacer.merge` adds the lost actor's ledger to it, so the
   run's ledger check covers both.

Until a replacement's first heartbeat the collector sends it none of its own
(:attr:`Liveness.starting <gflowdist.runtime.liveness.Liveness>`): a spare
still importing torch on a loaded machine makes no MPI progress, and the beats
would fill the control channel's in-flight bound. A replacement that sends no
heartbeat within ``faults.startup_timeout_s`` (a
spare that died meanwhile, or failed in its role's setup) is named on the
console, and the run goes on without the rank, as under ``continue``, or with
the next spare. A replacement that is lost in turn is replaced again, within
the same bound.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gflowdist.layout import Role
from gflowdist.runtime import protocol
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.liveness import Liveness
from gflowdist.runtime.spares import Spares
from gflowdist.runtime.wiring import Wiring
from gflowdist.standin import HANDSHAKE_TAG

__all__ = ["Replacer", "Replacement", "adopt", "add_ledger", "HANDSHAKE_TAG"]

log = logging.getLogger("gflowdist.runtime")


@dataclass
class Replacement:
    """One lost actor and its replacement: the lost one's counts, and how far the replacement got."""

    rank: int
    reason: str  # why the actor was lost
    produced_beat: int  # what the lost actor's last heartbeat said it had produced
    started: float  # when the spare was told to stand in (monotonic)
    spare: int = 0  # which spare (its rank in the spares' group)
    received: dict[int, int] = field(default_factory=dict)  # buffer -> what it received from the lost actor
    first_heartbeat: float | None = None

    def seconds(self) -> float | None:
        """From the spare's call to the replacement's first heartbeat (None: not heard from)."""
        return None if self.first_heartbeat is None else round(self.first_heartbeat - self.started, 3)

    def ledger(self) -> Ledger:
        """The lost actor's ledger: what it produced, what reached a buffer, the rest dropped as ``lost_rank``."""
        received = sum(self.received.values())
        produced = max(self.produced_beat, received)
        ledger = Ledger(produced=produced, sent=produced)
        ledger.drop("lost_rank", produced - received)
        return ledger


class Replacer:
    """The collector's side: hand a lost actor's rank to a spare, tell its peers, keep the lost actors' ledgers."""

    def __init__(self, w: Wiring, say: Callable[[str], None], run_dir: Any):
        self.w = w
        self.say = say  # a line on the console, beside the progress line (ProgressLine.say)
        self.run_dir = run_dir
        self.layout = w.context.layout
        self.allowed = w.settings.on_actor_loss == "replace"
        self.limit = w.settings.max_restarts
        self.done: list[Replacement] = []  # every replacement made, in order
        self.pending: dict[int, Replacement] = w.liveness.starting  # rank -> replacement not yet heard from
        self._sends: list[Any] = []  # the requests of what was sent to spares (kept until complete)

    @property
    def spares(self) -> Spares | None:
        return self.w.liveness.spares

    def may_replace(self, rank: int) -> bool:
        spares = self.spares
        left = spares is not None and bool(spares.idle())
        return self.allowed and left and self.layout.role_of(rank) is Role.ACTOR and len(self.done) < self.limit

    def no_spare_left(self) -> str:
        """Why a lost actor cannot be replaced although ``replace`` asks it ('' when it can, or the policy is
        another): what the console's line about the loss adds."""
        spares = self.spares
        if not self.allowed or spares is None:
            return ""
        if len(self.done) >= self.limit:
            return f"faults.max_restarts ({self.limit}) replacement{'' if self.limit == 1 else 's'} made"
        if not spares.idle():
            silent = f", {len(spares.silent)} fell silent while idle" if spares.silent else ""
            return f"no spare actor left ({len(spares.called)} called{silent})"
        return ""

    def watch_spares(self) -> None:
        """An idle spare fallen silent (:meth:`Spares.fallen_silent <gflowdist.runtime.spares.Spares.fallen_silent>`)
        is named on the console once, and to every rank, and never called (the collector's, at each poll)."""
        spares = self.spares
        if spares is None or spares.beats is None or not self.allowed:
            return
        for index, why in spares.fallen_silent(self.grace_s(), self.w.settings.rank_silence_s):
            self.w.liveness.deaths.spare_named()  # its end made hydra signal every rank: not a rank's death
            for other in self.w.liveness.running_peers():
                self.w.control.isend(*protocol.spare_lost(index, why), other)
            left = len(spares.idle())
            self._say(
                f"spare actor {index + 1} of {spares.count} fell silent while idle ({why}): it replaces no lost "
                f"actor; {left} spare{'' if left == 1 else 's'} left",
                title="spare lost",
            )

    def spare_notes(self) -> tuple[str, ...]:
        """The report's lines about spares that fell silent while idle (:meth:`watch_spares`)."""
        spares = self.spares
        if spares is None:
            return ()
        return tuple(
            f"spare actor {i + 1} of {spares.count} fell silent while idle ({why})" for i, why in spares.silent.items()
        )

    def replace(self, rank: int, reason: str, produced_beat: int) -> None:
        """Make the next spare actor ``rank`` (already gone on without): no wait on anything (module docstring)."""
        spares = self.spares
        if spares is None:
            raise RuntimeError(f"no spare actor to replace rank {rank} with")
        record = Replacement(rank, reason, produced_beat, time.monotonic(), spare=spares.idle()[0])
        spares.called.append(record.spare)
        incarnation = 1 + sum(1 for earlier in self.done if earlier.rank == rank)
        self._sends.append(spares.inter.isend(self._spec(record, incarnation), dest=record.spare, tag=HANDSHAKE_TAG))
        self.done.append(record)
        self.pending[rank] = record
        self.w.comm.route(rank, spares.inter, record.spare)  # type: ignore[attr-defined]  # an MPIComm
        for channel in self.w.channels.all():
            channel.new_peer(rank)
        for peer in self.peers_of(rank):
            if peer != self.w.rank:
                self.w.control.isend(*protocol.replaced(rank, record.spare), peer)
        self.w.lost.pop(rank, None)  # I expect its heartbeats and its final report again
        where = self.w.context.describe_rank(rank)
        self._say(
            f"replacing {where} (lost: {reason}): spare actor {record.spare + 1} of {spares.count}, "
            f"started with MPI_Comm_spawn, takes its place"
        )

    def release(self) -> None:
        """At the run's end: the spares never called are told so (None); each ends with the ranks on its host."""
        spares = self.spares
        if spares is None:
            return
        for index in spares.idle():  # not those fallen silent: a send to a dead process may never complete
            self._sends.append(spares.inter.isend(None, dest=index, tag=HANDSHAKE_TAG))
        spares.called.extend(spares.idle())

    def peers_of(self, rank: int) -> list[int]:
        """Who exchanges messages with actor ``rank`` besides the collector: its trainer and its buffer."""
        placement = self.layout.for_rank(rank)
        return [p for p in (placement.trainer, placement.buffer) if p is not None]

    def _spec(self, record: Replacement, incarnation: int) -> dict[str, Any]:
        """What the spare is told: who it stands in for, its peers (by rank in the spares' group), the run."""
        hosts = [self.layout.host_of(r) for r in range(self.w.comm.size)]
        spares = self.spares
        if spares is None:
            raise RuntimeError("no spare actors")
        return {
            "rank": record.rank,
            "size": self.w.comm.size,
            "collector": self.w.rank,
            "members": spares.members,
            "layout": self.layout.to_dict(),
            "hosts": hosts if all(hosts) else None,
            "run_dir": os.fspath(self.run_dir),
            "generation": self.w.generation,
            "incarnation": incarnation,
            "startup_timeout_s": self.grace_s(),
            # launch.devices for the replacement: the lost rank's device (None: not known)
            "device": self.w.context.devices[record.rank] if self.w.context.devices else None,
        }

    def heard(self, rank: int) -> None:
        """A heartbeat of ``rank``: a pending replacement has started."""
        record = self.pending.pop(rank, None)
        if record is not None:
            record.first_heartbeat = time.monotonic()
            log.info(
                "the replacement of rank %d is running (%.2f s after its spawn)",
                rank,
                record.first_heartbeat - record.started,
            )

    def silence(self, rank: int, reason: str) -> str:
        """Why ``rank`` is lost: a replacement that never sent a heartbeat is named as one that did not start."""
        record = self.pending.pop(rank, None)
        if record is None:
            return reason
        return (
            f"its replacement sent no heartbeat within faults.startup_timeout_s "
            f"({self.grace_s():g} s; its log: logs/rank-{rank}.log)"
        )

    def adopted(self, sender: int, body: Mapping[str, Any]) -> None:
        """A trainer or buffer reaches replacement ``body["rank"]``; a buffer says what it got from the lost one."""
        rank = int(body["rank"])
        records = [record for record in self.done if record.rank == rank]
        if records:  # a buffer reports all it received from the rank so far: the newest lost process's share
            earlier = sum(record.received.get(sender, 0) for record in records[:-1])
            records[-1].received[sender] = int(body.get("received", 0)) - earlier

    def earlier_ledgers(self) -> dict[int, Ledger]:
        """Each replaced rank's lost processes' ledgers, summed: what a checkpoint's manifest keeps under
        ``replaced`` (a resumed rank adds it to its own: :func:`gflowdist.runtime.resume.restore`)."""
        summed: dict[int, Ledger] = {}
        for record in self.done:
            add_ledger(summed.setdefault(record.rank, Ledger()), record.ledger())
        return summed

    def grace_s(self) -> float:
        """How long a replacement may take to send its first heartbeat."""
        return self.w.settings.startup_timeout_s

    def merge(self, finals: dict[int, dict[str, Any]], beats: Mapping[int, Mapping[str, Any]]) -> None:
        """Add each lost actor's ledger to the final report of its rank's last process.

        That process is its replacement (its own final report), or, when it was lost too and not replaced, the
        collector's account of it (``lost`` in its final): that one is written again here from what the buffers
        received beyond the earlier processes, and from its last heartbeat (``beats``).
        """
        by_rank: dict[int, list[Replacement]] = {}
        for record in self.done:
            by_rank.setdefault(record.rank, []).append(record)
        for rank, records in by_rank.items():
            final = finals.get(rank)
            if final is None:
                continue
            ledger = Ledger.from_dict(final["ledger"])
            if final.get("lost"):  # final_of counted every process's deliveries as this one's
                ledger = self.last_process(rank, ledger, beats)
            for record in records:
                lost = record.ledger()
                add_ledger(ledger, lost)
                final.setdefault("replaced", []).append(
                    {"reason": record.reason, "ledger": lost.to_dict(), "seconds_to_heartbeat": record.seconds()}
                )
            final["ledger"] = ledger.to_dict()

    def last_process(self, rank: int, ledger: Ledger, beats: Mapping[int, Mapping[str, Any]]) -> Ledger:
        """The collector's account of lost ``rank`` (``ledger``: every process of it, from
        :meth:`LostActors.ledger_of <gflowdist.runtime.lost_actors.LostActors.ledger_of>`) less what its earlier,
        replaced processes delivered: its last process's own, from that one's last heartbeat (``beats``).

        ``ledger`` itself for a rank never replaced. A checkpoint's slot for the rank holds this, and its manifest
        the earlier processes' ledgers under ``replaced``, which a resumed rank adds (a slot with every process's
        counts had them twice: a resumed run's ledger did not balance).
        """
        records = [record for record in self.done if record.rank == rank]
        if not records:
            return ledger
        received = ledger.produced - ledger.dropped.get("lost_rank", 0)
        received -= sum(sum(record.received.values()) for record in records)
        produced = max(int(beats.get(rank, {}).get("produced", 0)), received)
        own = Ledger(produced=produced, sent=produced)
        own.drop("lost_rank", produced - received)
        return own

    def _say(self, text: str, title: str = "rank replaced") -> None:
        self.w.reports.note(title, "fault", text=text)
        log.warning("%s", text)
        self.say(f"gflowdist: {text}")


def add_ledger(ledger: Ledger, lost: Ledger) -> Ledger:
    """Add a lost process's producer counts (``produced``, ``sent``, ``dropped``) to ``ledger``; returns it."""
    ledger.produced += lost.produced
    ledger.sent += lost.sent
    ledger.dropped.update(lost.dropped)
    return ledger


def adopt(liveness: Liveness, rank: int, spare: int) -> None:
    """My side of a replacement: reach ``rank`` through the spares' intercommunicator, where it is spare
    ``spare``; tell the collector.

    Messages to and from ``rank`` are numbered from 0 again. A trainer sends it
    its newest weights when it next publishes (it is a live actor again); a buffer
    reports what it had received from the lost actor.
    """
    spares = liveness.spares
    if spares is None:
        raise RuntimeError(f"the collector replaced rank {rank} with a spare actor, but rank {liveness.rank} has none")
    liveness.comm.route(rank, spares.inter, spare)  # type: ignore[attr-defined]  # an MPIComm (replace: MPI)
    for channel in liveness.channels.all():
        channel.new_peer(rank)
    liveness.lost.pop(rank, None)
    received = int(liveness.ledger.received_from.get(rank, 0))
    if liveness.rank != liveness.collector:
        liveness.channels.control.isend(*protocol.adopted(rank, received), liveness.collector)
    log.warning(
        "reaching the replacement of rank %d (spare actor %d) through the spares' intercommunicator", rank, spare
    )
