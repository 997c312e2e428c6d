"""Replacing a lost actor (``faults.on_actor_loss: replace``): the collector's side and its peers'.

When an actor falls silent for longer than ``faults.peer_timeout_s``, the
collector first goes on without it as under ``continue``
(:mod:`gflowdist.runtime.lost_actors`: its in-flight trajectories are dropped,
reason ``lost_rank``), then, while the job has replaced fewer than
``faults.max_restarts`` actors, :class:`Replacer` starts a new one in its place
with MPI's dynamic processes, under the same mpiexec:

1. ``MPI_Comm_spawn`` (``COMM_SELF``: the dead rank is still in the world
   communicator, so no collective over it could finish) starts
   ``python -m gflowdist.standin``,
   which gets an intercommunicator to the collector, opens an MPI port and
   sends its name back; the collector sends it the layout and the run
   directory;
2. the collector tells the lost actor's trainer and buffer (:func:`protocol.replaced
   <gflowdist.runtime.protocol.replaced>`); each connects to that port
   (:func:`adopt`), and from then on reaches the rank through that
   intercommunicator (:meth:`gflowdist.comm.mpi.MPIComm.route`), numbering its
   messages to and from it from 0 again; the buffer says how many trajectories
   it had received from the lost actor (:func:`protocol.adopted
   <gflowdist.runtime.protocol.adopted>`), which fixes the lost one's ledger;
3. the stand-in builds the actor role afresh, counts from zero, takes the next
   weights its trainer publishes (every ``sync.weights_to_actors_every``
   versions, to every live actor), and ships to its buffer; its final report reaches the collector like any
   other, and :meth:`Replacer.merge` adds the lost actor's ledger to it, so the
   run's ledger check covers both.

A replacement that cannot start (spawn refused, no port within
``faults.peer_timeout_s``, no heartbeat within ``faults.startup_timeout_s``)
is named on the console, and the run goes on without the rank, as under
``continue``. A replacement that is lost in turn is replaced again, within the
same bound.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from gflowdist.layout import Role
from gflowdist.runtime import protocol
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.liveness import Liveness
from gflowdist.runtime.wiring import Wiring
from gflowdist.standin import HANDSHAKE_TAG

__all__ = ["Replacer", "Replacement", "adopt", "add_ledger", "spawn_unsupported", "HANDSHAKE_TAG", "STANDIN_MODULE"]

log = logging.getLogger("gflowdist.runtime")

#: What the spawned process runs (``python -m``).
STANDIN_MODULE = "gflowdist.standin"


def spawn_unsupported() -> str | None:
    """Why this process's MPI library cannot start a replacement (None: it can: MPI-2 dynamic processes)."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        return f"mpi4py cannot be imported ({err})"
    if MPI.Get_version() < (2, 0):
        return f"the MPI library implements MPI {MPI.Get_version()[0]}, without MPI_Comm_spawn (MPI-2)"
    if MPI.Is_initialized() and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return "MPI runs without MPI_THREAD_MULTIPLE: the collector could not spawn while it keeps serving the job"
    return None


@dataclass
class Replacement:
    """One lost actor and its replacement: the lost one's counts, and how far the replacement got."""

    rank: int
    reason: str  # why the actor was lost
    produced_beat: int  # what the lost actor's last heartbeat said it had produced
    started: float  # when the replacement was spawned (monotonic)
    received: dict[int, int] = field(default_factory=dict)  # buffer -> what it received from the lost actor
    first_heartbeat: float | None = None
    ready: threading.Event = field(default_factory=threading.Event)  # the spawn and handshake ended
    inter: Any = None  # the intercommunicator to the new process
    port: str = ""  # the MPI port it listens on for its other peers
    error: str = ""  # why it could not start

    def seconds(self) -> float | None:
        """From the spawn to the replacement's first heartbeat (None: not heard from)."""
        return None if self.first_heartbeat is None else round(self.first_heartbeat - self.started, 3)

    def ledger(self) -> Ledger:
        """The lost actor's ledger: what it produced, what reached a buffer, the rest dropped as ``lost_rank``."""
        received = sum(self.received.values())
        produced = max(self.produced_beat, received)
        ledger = Ledger(produced=produced, sent=produced)
        ledger.drop("lost_rank", produced - received)
        return ledger


class Replacer:
    """The collector's side: spawn a replacement, tell its peers, keep the lost actors' ledgers."""

    def __init__(self, w: Wiring, out: TextIO, run_dir: Any):
        self.w = w
        self.out = out
        self.run_dir = run_dir
        self.layout = w.context.layout
        self.allowed = w.settings.on_actor_loss == "replace"
        self.limit = w.settings.max_restarts
        self.done: list[Replacement] = []  # every replacement made, in order
        self.starting: dict[int, Replacement] = {}  # rank -> replacement whose process is being spawned
        self.pending: dict[int, Replacement] = {}  # rank -> replacement not yet heard from

    def may_replace(self, rank: int) -> bool:
        started = len(self.done) + len(self.starting)
        return self.allowed and self.layout.role_of(rank) is Role.ACTOR and started < self.limit

    def replace(self, rank: int, reason: str, produced_beat: int) -> None:
        """Start a new actor in place of ``rank`` (already gone on without), in a thread: ``MPI_Comm_spawn`` returns
        only once the new process initialised MPI, and meanwhile the collector keeps serving the job (:meth:`poll`)."""
        record = Replacement(rank, reason, produced_beat, time.monotonic())
        self.starting[rank] = record
        threading.Thread(target=self._start, args=(record,), name=f"gflowdist-replace-{rank}", daemon=True).start()

    def _start(self, record: Replacement) -> None:
        try:
            record.inter, record.port = self._spawn(record.rank, len(self.done) + len(self.starting))
        except Exception as err:  # any failure to start is named, and the run goes on without the rank
            record.error = f"{type(err).__name__}: {err}"
        record.ready.set()

    def poll(self) -> list[int]:
        """The replacements whose process has started since the last call: reach each, tell its peers; their ranks.

        One that could not start is named, and the run goes on without its rank (as under ``continue``).
        """
        started = []
        for rank, record in list(self.starting.items()):
            if not record.ready.is_set():
                continue
            del self.starting[rank]
            where = self.w.context.describe_rank(rank)
            if record.error:
                self._say(f"could not replace {where}: {record.error}; going on without it")
                continue
            self.done.append(record)
            self.pending[rank] = record
            self.w.comm.route(rank, record.inter)  # type: ignore[attr-defined]  # an MPIComm: the engine allows it
            for channel in self.w.channels.all():
                channel.new_peer(rank)
            for peer in self.peers_of(rank):
                if peer != self.w.rank:
                    self.w.control.isend(*protocol.replaced(rank, record.port), peer)
            self.w.lost.pop(rank, None)  # I expect its heartbeats and its final report again
            self._say(f"replacing {where} (lost: {record.reason}): a new actor started with MPI_Comm_spawn")
            started.append(rank)
        return started

    def peers_of(self, rank: int) -> list[int]:
        """Who exchanges messages with actor ``rank`` besides the collector: its trainer and its buffer."""
        placement = self.layout.for_rank(rank)
        return [p for p in (placement.trainer, placement.buffer) if p is not None]

    def _spawn(self, rank: int, incarnation: int) -> tuple[Any, str]:
        from mpi4py import MPI

        why = spawn_unsupported()
        if why is not None:
            raise RuntimeError(why)
        info = MPI.Info.Create()
        info.Set("wdir", os.getcwd())
        args = ["-m", STANDIN_MODULE]
        try:
            inter = MPI.COMM_SELF.Spawn(sys.executable, args=args, maxprocs=1, info=info)
        finally:
            info.Free()
        request = inter.irecv(source=0, tag=HANDSHAKE_TAG)
        deadline = time.monotonic() + self.w.settings.peer_timeout_s
        while True:
            done, port = request.test()
            if done:
                break
            if time.monotonic() > deadline:
                request.Cancel()
                raise TimeoutError(f"the new process sent no MPI port within {self.w.settings.peer_timeout_s:g} s")
            time.sleep(0.005)
        hosts = [self.layout.host_of(r) for r in range(self.w.comm.size)]
        inter.send(
            {
                "rank": rank,
                "size": self.w.comm.size,
                "collector": self.w.rank,
                "peers": [p for p in self.peers_of(rank) if p != self.w.rank],
                "layout": self.layout.to_dict(),
                "hosts": hosts if all(hosts) else None,
                "run_dir": os.fspath(self.run_dir),
                "generation": self.w.generation,
                "incarnation": incarnation,
                "startup_timeout_s": self.grace_s(),
            },
            dest=0,
            tag=HANDSHAKE_TAG,
        )
        return inter, str(port)

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

    def merge(self, finals: dict[int, dict], beats: Mapping[int, Mapping[str, Any]]) -> None:
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
                received = ledger.produced - ledger.dropped.get("lost_rank", 0)
                received -= sum(sum(r.received.values()) for r in records)
                produced = max(int(beats.get(rank, {}).get("produced", 0)), received)
                ledger = Ledger(produced=produced, sent=produced)
                ledger.drop("lost_rank", produced - received)
            for record in records:
                lost = record.ledger()
                add_ledger(ledger, lost)
                final.setdefault("replaced", []).append(
                    {"reason": record.reason, "ledger": lost.to_dict(), "seconds_to_heartbeat": record.seconds()}
                )
            final["ledger"] = ledger.to_dict()

    def _say(self, text: str) -> None:
        self.w.reports.note("rank replaced", "fault", text=text)
        log.warning("%s", text)
        self.out.write(f"gflowdist: {text}\n")
        self.out.flush()


def add_ledger(ledger: Ledger, lost: Ledger) -> Ledger:
    """Add a lost process's producer counts (``produced``, ``sent``, ``dropped``) to ``ledger``; returns it."""
    ledger.produced += lost.produced
    ledger.sent += lost.sent
    ledger.dropped.update(lost.dropped)
    return ledger


def adopt(liveness: Liveness, rank: int, port: str) -> None:
    """My side of a replacement: connect to its port, reach ``rank`` through it, tell the collector.

    Messages to and from ``rank`` are numbered from 0 again. A trainer sends it
    its newest weights when it next publishes (it is a live actor again); a buffer
    reports what it had received from the lost actor.
    """
    from mpi4py import MPI

    inter = MPI.COMM_SELF.Connect(port)
    inter.send(liveness.rank, dest=0, tag=HANDSHAKE_TAG)
    liveness.comm.route(rank, inter)  # type: ignore[attr-defined]  # an MPIComm (the engine allows replace)
    for channel in liveness.channels.all():
        channel.new_peer(rank)
    liveness.lost.pop(rank, None)
    received = int(liveness.ledger.received_from.get(rank, 0))
    if liveness.rank != liveness.collector:
        liveness.channels.control.isend(*protocol.adopted(rank, received), liveness.collector)
    log.warning("reaching the replacement of rank %d through its own intercommunicator", rank)
