"""The inference rank's loop (``layout.inference``): run the policy of its actors, batched across them.

    per turn: hear the collector -> newest weights from my trainer (or its stop)
              -> gather my actors' requests -> once the batch is ready: one forward, a reply to each
    until my trainer said stop and every actor I serve said done

The policy is the configured actor class (``roles.actor``), set up on this rank
as on an actor; its ``act`` runs on the concatenated observations (and per-row
arguments) of every request in a batch, and each actor gets its own rows back,
stamped with the policy version of the weights that made them.

Dynamic batching (section ``inference``): a batch runs once it holds
``inference.max_batch`` observations, or once every actor I serve that has
not finished is waiting on me (nobody else can ask), or once its oldest request
has waited ``inference.max_delay_ms``. A request is never split. Its queueing
delay is the time from when this rank first saw it to the start of its batch's
forward; the final report carries the batch sizes and the delays
(:class:`InferenceStats`), which the run report shows.

Bad input: every request of every actor must have the same observation shape
and dtype, and the same per-row argument shapes, as the first request this rank
saw; a request that differs is refused (:func:`~gflowdist.runtime.protocol.infer_refused`)
with a text naming the actor, the field, expected and got, and the actor fails
with it.

Record and replay (``--record``): the requests (and dones) this rank takes, in
order (``INFER``), its trainer's weights and stop (``INBOX``), each at the count
of requests taken so far, and the points at which a batch ran (``SERVE``) are
its timed choices; a replay takes and batches as recorded, so every batch holds
the same requests in the same order (and the policy draws the same random
numbers for them).

Every wait has a deadline: once my trainer said stop, the actors I serve have
``faults.peer_timeout_s`` to say done (:class:`~gflowdist.errors.DeadlineError`
names those that did not); meanwhile a lost collector is named as on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gflowdist.comm.polling import round_trip_backoff
from gflowdist.errors import DeadlineError, GflowdistError
from gflowdist.runtime import protocol
from gflowdist.runtime.protocol import Command, MessageType, command_of
from gflowdist.runtime.roles import Actor
from gflowdist.runtime.state import ActorState
from gflowdist.runtime.tape import Site
from gflowdist.runtime.wiring import Wiring

__all__ = ["run_inference", "InferenceStats"]

#: Queueing delays kept for the report's percentiles (a reservoir of the most recent).
DELAYS_KEPT = 4096


@dataclass
class InferenceStats:
    """What an inference rank did: its batches (observations each), requests, queueing delays, forward time."""

    max_batch: int = 0
    max_delay_ms: float = 0.0
    batches: int = 0
    requests: int = 0
    observations: int = 0
    refused: int = 0
    forward_s: float = 0.0
    sizes: dict[int, int] = field(default_factory=dict)  # observations in a batch -> how many batches
    delays_s: list[float] = field(default_factory=list)  # the most recent requests' queueing delays
    delay_sum_s: float = 0.0
    delay_max_s: float = 0.0
    closed_by: dict[str, int] = field(default_factory=dict)  # why each batch ran: full, all waiting, delay, end

    def add_batch(self, rows: int, delays: list[float], forward_s: float, why: str) -> None:
        self.batches += 1
        self.requests += len(delays)
        self.observations += rows
        self.forward_s += forward_s
        self.sizes[rows] = self.sizes.get(rows, 0) + 1
        self.closed_by[why] = self.closed_by.get(why, 0) + 1
        self.delay_sum_s += sum(delays)
        self.delay_max_s = max([self.delay_max_s, *delays])
        self.delays_s.extend(delays)
        if len(self.delays_s) > DELAYS_KEPT:
            del self.delays_s[: len(self.delays_s) - DELAYS_KEPT]

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the final report (delays in milliseconds)."""
        kept = sorted(self.delays_s)

        def pct(q: float) -> float:
            return 1e3 * kept[min(len(kept) - 1, int(q * len(kept)))] if kept else 0.0

        return {
            "max_batch": self.max_batch,
            "max_delay_ms": self.max_delay_ms,
            "batches": self.batches,
            "requests": self.requests,
            "observations": self.observations,
            "refused": self.refused,
            "mean_batch": self.observations / self.batches if self.batches else 0.0,
            "mean_requests_per_batch": self.requests / self.batches if self.batches else 0.0,
            "sizes": {str(k): v for k, v in sorted(self.sizes.items())},
            "closed_by": dict(self.closed_by),
            "delay_mean_ms": 1e3 * self.delay_sum_s / self.requests if self.requests else 0.0,
            "delay_p50_ms": pct(0.5),
            "delay_p95_ms": pct(0.95),
            "delay_max_ms": 1e3 * self.delay_max_s,
            "forward_mean_ms": 1e3 * self.forward_s / self.batches if self.batches else 0.0,
        }


@dataclass
class _Request:
    actor: int
    seq: int
    obs: torch.Tensor
    args: list[torch.Tensor]
    seen: float  # when this rank first saw it (time.monotonic)


def run_inference(policy: Actor, w: Wiring, state: ActorState) -> InferenceStats:
    """Serve my actors until my trainer said stop and each of them said done; returns what I did."""
    loop = InferenceLoop(policy, w, state)
    loop.run()
    return loop.stats


def _act_of(policy: Actor) -> Callable[..., Any]:
    """The policy's ``act`` (an actor class run on an inference rank defines it, as the ``gflowdist.rl`` actors do)."""
    # not a method of Actor: the classes that serve through inference have it
    act: object = getattr(policy, "act", None)
    if not callable(act):
        cls = type(policy)
        raise GflowdistError(
            f"roles.actor: {cls.__module__}.{cls.__qualname__} has no act(obs, ...) method, which an inference "
            "rank runs for its actors (layout.inference); the gflowdist.rl actors define it"
        )
    return act


class InferenceLoop:
    """One inference rank's loop: its actors, the batch being gathered, one method per step."""

    def __init__(self, policy: Actor, w: Wiring, state: ActorState):
        self.policy, self.w, self.state = policy, w, state
        self.act = _act_of(policy)
        placement = w.context.placement
        self.trainer, self.actors = placement.trainer, tuple(placement.served)
        settings = w.settings
        self.max_batch, self.max_delay_s = settings.inference_max_batch, settings.inference_max_delay_ms / 1e3
        self.stats = InferenceStats(max_batch=self.max_batch, max_delay_ms=settings.inference_max_delay_ms)
        self.pending: list[_Request] = []
        self.rows = 0
        self.done: set[int] = set()
        self.taken = 0  # requests and dones taken: the point of my recorded choices
        self.trainer_stopped = False
        self.stopped_at = 0.0
        #: the shapes every request must have: (obs row shape, obs dtype, arg row shapes and dtypes), who set them
        self.expected: tuple[Any, int] | None = None

    def run(self) -> None:
        w = self.w
        idle = round_trip_backoff()
        idle_s, idle_end = 0.0, 0.0
        while not (self.trainer_stopped and self.finished()):
            started = time.perf_counter()
            w.liveness.check_control()  # a lost collector is named here; the coordinator's stop reaches me through my trainer
            if not self.trainer_stopped:
                self.read_trainer()
            got = self.gather()
            why = self.ready()
            # which requests run together is a timed choice: recorded (--record), or made as recorded (replay)
            if self.pending and self.w.choices.decide(Site.SERVE, self.taken, bool(why)):
                if idle_s:
                    w.timer.record("idle", idle_s, end=started)
                    idle_s = 0.0
                self.serve(why or "as recorded")
                idle.reset()
            elif not got:
                idle.pause()
                idle_end = time.perf_counter()
                idle_s += idle_end - started
            w.liveness.heartbeat(self.state.version)
            self.check_deadline()
        if self.pending and self.w.choices.decide(Site.SERVE, self.taken, True):
            self.serve("end")
        if idle_s:
            w.timer.record("idle", idle_s, end=idle_end)
        w.inference.drain()

    def live(self) -> list[int]:
        """The actors I serve less those the run goes on without (``faults.on_actor_loss: continue``)."""
        return [a for a in self.actors if a not in self.w.lost]

    def finished(self) -> bool:
        return all(a in self.done for a in self.live())

    def read_trainer(self) -> None:
        """Load the newest weights my trainer sent (older ones in the same look are skipped); note its stop."""
        newest = None
        take = self.w.choices.take
        msg = take(Site.INBOX, self.w.weights, self.taken, source=self.trainer)
        while msg is not None:
            if command_of(msg) is Command.STOP:
                self.trainer_stopped, self.stopped_at = True, time.monotonic()
            elif msg.type is MessageType.WEIGHTS:
                newest = msg
            msg = take(Site.INBOX, self.w.weights, self.taken, source=self.trainer)
        if newest is not None:
            with self.w.timer.phase("load_weights"):
                self.policy.load_weights(newest.body["state"], newest.body["version"])
            self.state.version = int(newest.body["version"])

    def gather(self) -> bool:
        """Take every request that arrived (and every actor's done); True if anything arrived."""
        got = False
        msg = self.w.choices.take(Site.INFER, self.w.inference, self.taken)
        while msg is not None:
            got = True
            self.taken += 1
            if command_of(msg) is Command.DONE:
                self.done.add(msg.sender)
            elif msg.type is MessageType.INFER_REQUEST:
                self.admit(msg.sender, msg.body)
            msg = self.w.choices.take(Site.INFER, self.w.inference, self.taken)
        return got

    def admit(self, actor: int, body: Mapping[str, Any]) -> None:
        """Queue a request, or refuse it when its shapes differ from those every request must have."""
        seq = int(body.get("seq", -1))
        obs, args = body.get("obs"), body.get("args")
        if not isinstance(obs, torch.Tensor) or obs.dim() < 1 or not isinstance(args, list):
            return self.refuse(actor, seq, f"actor rank {actor}'s request {seq} has no observation tensor [n, ...]")
        if not all(isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == obs.shape[0] for a in args):
            return self.refuse(
                actor, seq, f"actor rank {actor}'s request {seq}: every argument needs one row per observation"
            )
        shapes = (_row(obs), tuple(_row(a) for a in args))
        if self.expected is None:
            self.expected = (shapes, actor)
        elif shapes != self.expected[0]:
            (want_obs, want_args), first = self.expected
            got_obs, got_args = shapes
            what = (
                f"observation shape {got_obs[0]} {got_obs[1]}, expected {want_obs[0]} {want_obs[1]}"
                if got_obs != want_obs
                else f"argument shapes {[f'{s} {d}' for s, d in got_args]}, expected {[f'{s} {d}' for s, d in want_args]}"
            )
            return self.refuse(
                actor,
                seq,
                f"actor rank {actor} sent request {seq} with {what} (per row, as actor rank {first}'s first "
                f"request set them): an inference rank batches only requests of one shape",
            )
        self.pending.append(_Request(actor, seq, obs, args, time.monotonic()))
        self.rows += int(obs.shape[0])
        return None

    def refuse(self, actor: int, seq: int, text: str) -> None:
        self.stats.refused += 1
        self.w.reports.note("inference request refused", "fault", actor=actor, seq=seq)
        self.w.inference.isend(*protocol.infer_refused(text, seq), actor)

    def ready(self) -> str:
        """Why the batch gathered so far runs now ('' while it waits for more)."""
        if not self.pending:
            return ""
        if self.rows >= self.max_batch:
            return "full"
        waiting = {r.actor for r in self.pending}
        if all(a in waiting or a in self.done for a in self.live()):
            return "all waiting"
        if time.monotonic() - self.pending[0].seen >= self.max_delay_s:
            return "delay"
        return ""

    def serve(self, why: str) -> None:
        """One forward over the gathered requests; each actor gets its rows, stamped with my policy version."""
        batch, self.pending, self.rows = self.pending, [], 0
        begun = time.monotonic()
        obs = torch.cat([r.obs for r in batch]) if len(batch) > 1 else batch[0].obs
        args = [torch.cat([r.args[i] for r in batch]) for i in range(len(batch[0].args))]
        with torch.no_grad(), self.w.timer.phase("forward"):
            out = self.act(obs, *args)
        forward_s = time.monotonic() - begun
        counts = [int(r.obs.shape[0]) for r in batch]
        with self.w.timer.phase("reply"):
            parts = _split(out, counts, f"{type(self.policy).__name__}.act")
            for request, part in zip(batch, parts, strict=True):
                self.w.inference.isend(
                    *protocol.infer_reply(
                        part, version=self.state.version, seq=request.seq, batch=self.stats.batches, size=sum(counts)
                    ),
                    request.actor,
                )
        self.stats.add_batch(sum(counts), [begun - r.seen for r in batch], forward_s, why)

    def check_deadline(self) -> None:
        """After my trainer's stop, my actors have ``faults.peer_timeout_s`` to say done."""
        if not self.trainer_stopped:
            return
        limit = self.w.settings.inference_done_s
        if time.monotonic() - self.stopped_at > limit:
            missing = [a for a in self.live() if a not in self.done]
            raise DeadlineError(
                f"inference rank {self.w.rank}: actor ranks {missing} did not say done within {limit:g} s "
                "(faults.peer_timeout_s) of my trainer's stop"
            )


def _row(t: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(t.shape[1:]), str(t.dtype).replace("torch.", "")


def _split(out: Any, counts: list[int], method: str, name: str = "its result") -> list[Any]:
    """Each request's rows of ``out`` (a tensor or a mapping of tensors, rows first), contiguous copies."""
    if isinstance(out, torch.Tensor):
        if out.dim() < 1 or out.shape[0] != sum(counts):
            raise GflowdistError(
                f"{method} returned {name} of shape {list(out.shape)} for {sum(counts)} observations; an inference "
                "rank needs one row per observation"
            )
        return [part.contiguous() for part in torch.split(out.detach().cpu(), counts)]
    if isinstance(out, Mapping):
        fields = {k: _split(v, counts, method, f"field {k!r}") for k, v in out.items()}
        return [{k: parts[i] for k, parts in fields.items()} for i in range(len(counts))]
    raise GflowdistError(
        f"{method} returned {name} as a {type(out).__name__}; an inference rank splits only tensors and mappings "
        "of them"
    )
