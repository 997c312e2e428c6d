"""The buffer's loop: serve my clients until every one of them said ``done``.

    per message: admit trajectories | answer a sample request | note a checkpoint marker | note done
                 then save every checkpoint whose markers have all arrived, and acknowledge it
    while idle:  heartbeat, a summary for the coordinator now and then, back off
    at the end:  drain my sends, a last summary

A buffer's steps are the messages it took (``taken``): the point at which its
tape records which client's message came next, and when a summary went out.

A queue (``replay.sampler: queue``) never overwrites an unserved item: a batch
that does not fit is parked, in arrival order, and admitted as sampling makes
room (its producers pace themselves so that this stays rare, see
:class:`gflowdist.rl.UnrollActor`); a checkpoint keeps the parked batches
(:class:`~gflowdist.runtime.state.BufferState`) and a resumed queue admits
them in the same order; what is still parked when every client is
done is dropped, reason ``queue_full``. Before serving a sample, a queue drops
the items whose policy lag at the requesting learner's version exceeds
``replay.max_staleness`` (the ledger: dropped, reason ``stale``, and
``expired``: admitted first).
"""

from __future__ import annotations

import collections
import logging
import time

from gflowdist.comm.polling import peer_wait
from gflowdist.errors import ProtocolError
from gflowdist.replay import RateLimitedError, ReplayBuffer
from gflowdist.replay.storage import ItemSchemaError
from gflowdist.runtime import protocol
from gflowdist.runtime.faults import refusal_text
from gflowdist.runtime.loops.priorities import apply_priority_update, sample_reply_for
from gflowdist.runtime.protocol import Command, MessageType, command_of
from gflowdist.runtime.roles import BufferManager
from gflowdist.runtime.state import BufferState
from gflowdist.runtime.tape import Site
from gflowdist.runtime.wiring import Wiring
from gflowdist.transport import Message

__all__ = ["run_buffer", "BufferLoop"]

log = logging.getLogger("gflowdist.runtime")


def run_buffer(manager: BufferManager, w: Wiring, state: BufferState, replay: ReplayBuffer) -> BufferState:
    """Serve my clients' inserts and sample requests until every client said done; returns ``state``."""
    BufferLoop(manager, w, state, replay).run()
    return state


class BufferLoop:
    """One buffer's loop: what it serves, who is done, which checkpoint cuts are open."""

    def __init__(self, manager: BufferManager, w: Wiring, state: BufferState, replay: ReplayBuffer):
        self.manager, self.w, self.state, self.replay = manager, w, state, replay
        self.clients = set(w.context.placement.clients)
        self.done: set[int] = set()
        self.marked: dict[str, set[int]] = {}  # periodic checkpoint name -> clients whose marker arrived
        self.backoff = peer_wait()
        self.last_summary = 0.0
        self.idle_s = 0.0  # the current idle stretch: one timer entry per stretch, not per poll
        self.idle_end = 0.0  # when its last pause ended (the trace's idle event ends there)
        self.taken = 0  # messages taken (malformed ones too): where this loop is

    @property
    def parked(self) -> collections.deque[Message]:
        """A full queue's batches, in arrival order: my state's, so that a checkpoint keeps them."""
        return self.state.parked

    @property
    def finished_clients(self) -> set[int]:
        """My clients that said ``done``, and those the run goes on without (``faults.on_actor_loss``)."""
        return self.done | (self.clients & set(self.w.lost))

    def run(self) -> None:
        while self.finished_clients != self.clients:
            try:
                msg = self.w.choices.take(Site.DATA, self.w.data, self.taken)
            except ProtocolError as err:  # counted and logged; the buffer keeps serving everyone else
                self.taken += 1
                self.w.ledger.malformed[-1 if err.sender is None else err.sender] += 1  # -1: unnamed (as tapes)
                self.w.reports.note("malformed message", "fault", sender=err.sender)
                log.warning("%s", err)
                continue
            self.w.liveness.heartbeat(self.w.ledger.received, stored=len(self.replay))
            if msg is None:
                self.idle()
                continue
            self.taken += 1
            self.busy()
            self.handle(msg)
            self.save_complete_cuts()
        self.drop_parked()
        self.w.data.drain()
        self.w.reports.report(protocol.summary(self.manager.summary()))

    # -- the steps -------------------------------------------------------------------------------
    def idle(self) -> None:
        """Nothing arrived: now and then a summary for the coordinator and a look at its messages; back off."""
        now = time.monotonic()
        due = now - self.last_summary > self.w.settings.summary_every_s
        if self.w.choices.decide(Site.SUMMARY, self.taken, due):  # a timed choice: recorded, replayed
            self.last_summary = now
            self.w.reports.report(protocol.summary(self.manager.summary()))
            self.w.liveness.check_control()
        paused = time.perf_counter()
        self.backoff.pause()
        self.idle_end = time.perf_counter()
        self.idle_s += self.idle_end - paused

    def busy(self) -> None:
        """A message arrived: close the idle stretch and poll eagerly again."""
        if self.idle_s:
            self.w.timer.record("idle", self.idle_s, end=self.idle_end)
            self.idle_s = 0.0
        self.backoff.reset()

    def handle(self, msg: Message) -> None:
        if msg.type is MessageType.TRAJECTORIES:
            with self.w.timer.phase("insert"):
                self.hear_version(msg)
                self.admit(msg)
        elif msg.type is MessageType.SAMPLE_REQUEST:
            self.hear_version(msg)
            with self.w.timer.phase("sample"):
                self.serve_sample(msg)
        elif msg.type is MessageType.PRIORITIES:
            with self.w.timer.phase("priorities"):
                apply_priority_update(self.replay, msg.body, msg.sender)
        elif command_of(msg) is Command.CHECKPOINT:
            self.marked.setdefault(msg.body["name"], set()).add(msg.sender)
        elif command_of(msg) is Command.DONE:
            self.done.add(msg.sender)

    def hear_version(self, msg: Message) -> None:
        """The newest policy version any client has told me of (what ``replay.max_staleness`` is counted from)."""
        self.state.latest_version = max(self.state.latest_version, int(msg.body["version"]))

    def admit(self, msg: Message) -> None:
        """Offer a client's trajectories to the replay buffer; the ledger counts each one's fate."""
        ledger, n = self.w.ledger, int(msg.body["n"])
        ledger.received += n
        ledger.received_from[msg.sender] += n
        self.offer(msg)

    def offer(self, msg: Message, unparked: bool = False) -> None:
        """Admit a received batch (or park it, behind those parked before, while a queue has no room)."""
        ledger, n = self.w.ledger, int(msg.body["n"])
        version, max_staleness = int(msg.body["version"]), self.w.settings.max_staleness
        if max_staleness is not None and self.state.latest_version - version > max_staleness:
            ledger.drop("stale", n)
            return
        if self.replay.sampler.backpressure and ((self.parked and not unparked) or not self.replay.has_room(n)):
            self.parked.append(msg)
            return
        batch = msg.body["batch"]
        try:
            self.replay.storage.check_schema(batch)
        except ItemSchemaError as err:
            self.refuse(msg, n, str(err))
            return
        try:
            result = self.replay.extend(
                batch,
                producer=msg.sender,
                seq=int(msg.body["seq"]),
                policy_version=version,
                scores=self.manager.score(batch),
                priorities=msg.body.get("priorities"),
            )
        except RateLimitedError:
            ledger.drop("rate_limit", n)
            return
        ledger.admitted += result.admitted
        ledger.drop("duplicate", result.rejected_duplicate)
        ledger.drop("low_score", result.rejected_low_score)
        ledger.evicted += result.evicted
        if result.admitted == n:  # all of it: the received batch itself, no masked copy of every field
            self.manager.on_admitted(batch)
        elif result.admitted:
            mask = result.admitted_mask
            self.manager.on_admitted({k: v[mask] for k, v in batch.items()})

    def refuse(self, msg: Message, n: int, reason: str) -> None:
        """A batch my storage cannot take: dropped and counted against its sender, who is told why.

        The sender's run fails or goes on (``faults.on_bad_batch``,
        :func:`~gflowdist.runtime.faults.on_refused`); I keep serving everyone.
        """
        ctx = self.w.context
        text = refusal_text(
            f"buffer {ctx.describe_rank(self.w.rank)}", ctx.describe_rank(msg.sender), n, int(msg.body["seq"]), reason
        )
        self.w.ledger.drop("bad_batch", n)
        self.w.ledger.refused[msg.sender] += 1
        self.w.reports.note("batch refused", "fault", sender=msg.sender, trajectories=n)
        log.warning("%s", text)
        self.w.control.isend(*protocol.refused(text, int(msg.body["seq"])), msg.sender)  # a collector: in poll

    def serve_sample(self, msg: Message) -> None:
        """Answer a sample request: a batch and its policy versions (prioritized: weights and keys, beta at
        the learner step that will use it), or nothing while too little is stored."""
        step = int(msg.body.get("step", msg.body["version"]))
        max_staleness = self.w.settings.max_staleness
        if self.replay.sampler.backpressure and max_staleness is not None:
            expired = self.replay.drop_stale(step, max_staleness)
            self.w.ledger.drop("stale", expired)
            self.w.ledger.expired += expired
        reply = sample_reply_for(self.replay, int(msg.body["n"]), step)
        self.w.data.isend(*reply, msg.sender)
        self.admit_parked()

    def admit_parked(self) -> None:
        """Admit parked batches, oldest first, while the queue has room for them."""
        while self.parked and self.replay.has_room(int(self.parked[0].body["n"])):
            msg = self.parked.popleft()
            with self.w.timer.phase("insert"):
                self.offer(msg, unparked=True)

    def drop_parked(self) -> None:
        """At the end: what a full queue still holds back is dropped, reason ``queue_full`` (never silently)."""
        self.admit_parked()
        for msg in self.parked:
            self.w.ledger.drop("queue_full", int(msg.body["n"]))
        if self.parked:
            log.warning(
                "buffer rank %d: %d batches parked for room in the queue were dropped at the end (queue_full)",
                self.w.rank,
                len(self.parked),
            )
        self.parked.clear()

    def save_complete_cuts(self) -> None:
        """Save every checkpoint whose markers came from all clients still running; acknowledge it to them."""
        for name in [n for n, senders in self.marked.items() if senders | self.finished_clients >= self.clients]:
            with self.w.timer.phase("checkpoint"):
                self.w.reports.checkpoint(name)  # every client is paused at the cut: my state is exactly theirs
            for client in sorted(self.marked.pop(name)):
                self.w.data.isend(*protocol.checkpointed(name, self.w.ledger.refused[client]), client)
