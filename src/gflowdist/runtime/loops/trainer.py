"""The trainer's loop: a short sequence of named steps, repeated ``run.steps`` times.

    align with my agent group, weights to my actors
    per step: rollout -> ship -> replayed -> learn -> return priorities -> sync -> publish
              -> checkpoint -> keep alive
    settle what my buffer still owes me, stop my actors, finish

A pure learner (``rollout`` returns None, as in Ape-X) learns from
``replay.learner_batch`` replayed items per step; while its buffer cannot
serve yet, a step waits (backing off, heartbeating) instead of learning.

Each step is a method of :class:`TrainerLoop`; the user's code runs in
``rollout`` (:meth:`Actor.rollout`) and ``learn`` (:meth:`Trainer.prepare`, then
:meth:`Trainer.loss` once per optimizer step: ``learner.epochs`` x
``learner.minibatches`` of them, see :mod:`~gflowdist.runtime.loops.learner_step`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.comm.polling import Backoff
from gflowdist.errors import GflowdistError
from gflowdist.runtime import protocol
from gflowdist.runtime.checkpoints import checkpoint_name
from gflowdist.runtime.faults import refusal_text
from gflowdist.runtime.loops.agent_group import AgentGroup
from gflowdist.runtime.loops.batches import check_batch, refusal_before_concat, role_method
from gflowdist.runtime.loops.client import (
    checkpoint_cut,
    concat_batches,
    drain_live,
    finish,
    reply_from,
    ship,
    trajectory_count,
    use_locally,
)
from gflowdist.runtime.loops.learner_step import LearnerStep, model_of
from gflowdist.runtime.loops.priorities import priority_update, replayed_batch
from gflowdist.runtime.roles import Trainer
from gflowdist.runtime.staging import DevicePath
from gflowdist.runtime.state import TrainerState
from gflowdist.runtime.tape import Site
from gflowdist.runtime.wiring import Wiring

__all__ = ["run_trainer", "TrainerLoop", "ReplayRequests", "fresh_refusal"]

log = logging.getLogger("gflowdist.runtime")


def run_trainer(trainer: Trainer, w: Wiring, state: TrainerState) -> TrainerState:
    """Run the trainer loop until ``run.steps`` or a stop; ``state`` is updated in place and returned."""
    TrainerLoop(trainer, w, state).run()
    return state


class ReplayRequests:
    """Sample requests to my buffer, kept ``replay.prefetch`` ahead of use (replies arrive in order).

    Each asks for this step's share, ``replay.replayed_per_step(fresh)`` (``fresh``
    None: a pure learner's ``replay.learner_batch``). With
    ``prefetch`` 0 each step asks and waits; with ``prefetch`` k the reply used
    at a step was asked for k steps earlier, and the first steps learn from
    fresh trajectories only.
    """

    def __init__(self, w: Wiring, buffer: int):
        self.w = w
        self.buffer = buffer
        self.prefetch = w.settings.prefetch
        self.outstanding = 0

    def take(self, state: TrainerState, fresh: int | None) -> dict[str, Any] | None:
        """The replayed batch for this step (None: nothing asked yet, or my buffer had too little);
        from a prioritized buffer with ``weights`` and ``keys``."""
        w, replayed = self.w, None
        per_step = w.settings.replayed_per_step(fresh)
        if self.outstanding == 0 and self.prefetch == 0:
            self._ask(per_step, state.version, state.version)  # used at once
        if self.outstanding:
            with w.timer.phase("wait_replay"), w.timer.wait_on(self.buffer, "replay"):
                reply = reply_from(w, self.buffer, w.settings.reply_timeout_s)
            self.outstanding -= 1
            replayed = replayed_batch(reply.body)
            if replayed is not None:
                state.staleness.update((state.version - reply.body["versions"]).tolist())
        while self.outstanding < self.prefetch:  # replies come in order: this one is used after the others
            self._ask(per_step, state.version, state.version + self.outstanding + 1)
        return replayed

    def settle(self) -> None:
        """Read (and drop) every reply still owed, so none is in flight across a checkpoint cut or the end.

        A queue served those items once and no longer holds them: each is counted in my ledger as
        dropped, reason ``unlearned``, and ``expired`` (admitted, then dropped), so the ledger stays
        exact across the cut. Items of other samplers stay in their buffer: nothing is lost.
        """
        queue = self.w.settings.sampler_name == "queue"
        for _ in range(self.outstanding):
            reply = reply_from(self.w, self.buffer, self.w.settings.reply_timeout_s)
            versions = reply.body.get("versions")
            if queue and versions is not None and len(versions):
                self.w.ledger.drop("unlearned", len(versions))
                self.w.ledger.expired += len(versions)
        self.outstanding = 0

    def _ask(self, n: int, version: int, step: int) -> None:
        """Ask for ``n`` items, to be used at learner step ``step`` (a prioritized buffer's beta is taken there)."""
        self.w.data.isend(*protocol.sample_request(n, version, step), self.buffer)
        self.outstanding += 1


class TrainerLoop:
    """One trainer's loop: its collaborators, and one method per step."""

    def __init__(self, trainer: Trainer, w: Wiring, state: TrainerState):
        self.trainer, self.w, self.state = trainer, w, state
        self.settings = w.settings
        placement = w.context.placement
        self.buffer, self.actors = placement.buffer, placement.actors
        #: ranks that run my actors' policy (layout.inference): my weights and stop go to them, not to my actors
        self.inference = tuple(placement.inference_ranks)
        self.group = AgentGroup(w.context.agent_group, self.settings.sync, w.timer, steps=self.settings.steps)
        settings = self.settings
        replays = settings.replay_fraction > 0 or settings.learner_batch
        self.requests = ReplayRequests(w, self.buffer) if self.buffer is not None and replays else None
        layout = w.context.layout
        self.evaluator = (
            layout.coordinator
            if self.settings.sync.weights_to_coordinator_every
            and layout.coordinator is not None
            and layout.trainers[0] == w.rank
            else None
        )
        self.idle = Backoff(spin_s=0.0, first_sleep_s=1e-4, max_sleep_s=0.01)
        #: my loop's turns: where my tape records what I took and saw; my step, but a pure learner's
        #: waits for items are turns too
        self.turn = state.step
        #: batches onto my device, weights off it once per publish (runtime.staging)
        self.device_path = DevicePath(trainer.device, timer=w.timer)
        self.learner = LearnerStep(
            trainer,
            self.group,
            self.settings.learner,
            w.timer,
            rank=w.rank,
            on_nonfinite=self.settings.on_nonfinite_loss,
            note_skip=lambda step: w.reports.note("non-finite loss", "fault", step=step),
        )

    def run(self) -> None:
        self.group.align(self.trainer.model)
        self.send_weights()
        while self.state.step < self.settings.steps and not self.group.agree_to_stop(self.w, self.turn):
            # where a replay names a divergence: the vote about this turn may have ridden in the last one's average
            self.w.choices.reached(self.turn)
            fresh = self.rollout()
            self.ship(fresh)
            replayed = self.replayed(fresh)
            batch = self.combine(fresh, replayed)
            if batch is None:
                self.wait_for_items()
                self.turn += 1
                continue
            self.device_path.check_once(self.trainer, self.w.rank)
            with self.device_path.out_of_memory(self.w.rank, self.state.step, batch):
                values = self.learn(batch)
            self.return_priorities(batch, replayed)
            self.sync()
            self.publish(values)
            self.state.step += 1
            self.turn += 1
            self.checkpoint()
            self.keep_alive()
        self.finish()

    # -- the steps, in order ------------------------------------------------------------------
    def rollout(self) -> dict[str, Any] | None:
        """The user's batch, checked where it is made (:func:`~gflowdist.runtime.loops.batches.check_batch`)."""
        with self.w.timer.phase("rollout"):
            fresh = self.trainer.rollout(self.state.version)
        if fresh is not None:
            check_batch(fresh, role_method(self.trainer, "rollout"), nonfinite=self.settings.on_nonfinite_batch)
        return fresh

    def ship(self, fresh: dict[str, Any] | None) -> None:
        """Fresh trajectories to my buffer (or counted as used here, without one)."""
        if fresh is None:
            return
        if self.buffer is None:
            use_locally(self.w, fresh, self.state)
            return
        with self.w.timer.phase("send"):
            ship(self.w, self.trainer, fresh, self.state, self.buffer)

    def replayed(self, fresh: dict[str, Any] | None) -> dict[str, Any] | None:
        """This step's replayed trajectories (``replay.replay_fraction`` of the batch, or a pure
        learner's ``replay.learner_batch``), if any."""
        if fresh is None and (self.requests is None or not self.settings.learner_batch):
            raise GflowdistError(
                f"{type(self.trainer).__name__}.rollout() returned None, so trainer rank "
                f"{self.w.rank} learns from replay only: set replay.learner_batch (replayed "
                f"items per step){'' if self.buffer is not None else ' and give it a buffer'}"
            )
        count = None if fresh is None else trajectory_count(fresh)
        return self.requests.take(self.state, count) if self.requests is not None else None

    def combine(self, fresh: dict[str, Any] | None, replayed: dict[str, Any] | None) -> dict[str, Any] | None:
        """Fresh followed by replayed trajectories. A fresh batch my buffer refuses (its fields, per-item shapes
        or dtypes differ from the replayed ones) is refused here first, in the buffer's words
        (``faults.on_bad_batch``): ``fail`` raises, ``drop`` learns from the replayed items alone."""
        if fresh is not None and replayed is not None and self.buffer is not None:  # only a buffer's items refuse
            ctx = self.w.context
            me, buffer = ctx.describe_rank(self.w.rank), ctx.describe_rank(self.buffer)
            refused = fresh_refusal(fresh, replayed, self.state.produced, buffer=buffer, me=me)
            if refused is not None:
                seq, text = refused
                self.w.reports.note("batch refused", "fault", seq=seq)
                # ship() recorded where it was made: the same words as the buffer's refusal (Liveness.refused)
                self.w.liveness.refusals.refuse_mine(seq, text, self.settings.on_bad_batch)
                log.warning(
                    "step %d learns from its %d replayed items alone", self.state.step, trajectory_count(replayed)
                )
                fresh = None  # drop: this step learns from what the buffer stores
        return concat_batches(self.device_path.stage(fresh), self.device_path.stage(replayed), self.trainer.device)

    def wait_for_items(self) -> None:
        """A pure learner whose buffer cannot serve yet: no step; back off, stay alive, ask again."""
        if self.group.shared:
            raise GflowdistError(
                f"trainer rank {self.w.rank} has nothing to learn from (its rollout gave None, "
                f"its buffer nothing yet) but averages with its agent group every step: a "
                f"pure learner needs sync.mode none or an agent group of one"
            )
        with self.w.timer.phase("wait_replay"):
            self.idle.pause()
        self.keep_alive()

    def learn(self, batch: dict[str, Any]) -> dict[str, float]:
        """prepare -> epochs x minibatches of (loss -> backward -> average in my agent group ->
        clip -> optimizer step) -> lr schedule -> version + 1 (:class:`LearnerStep`); the step's
        loss and named values for the metrics."""
        values = self.learner(batch, self.state.step)
        self.w.choices.check(Site.LOSS, self.state.step, lambda: values["loss"])
        self.state.version += 1
        self.idle.reset()
        return values

    def return_priorities(self, batch: dict[str, Any], replayed: dict[str, Any] | None) -> None:
        """The replayed items' new priorities (:meth:`Trainer.priorities`) to my buffer, not waited for."""
        update = priority_update(self.trainer, batch, 0 if replayed is None else trajectory_count(replayed))
        if update is not None and self.buffer is not None:  # replayed items: there is a buffer
            self.w.data.isend(*update, self.buffer)

    def sync(self) -> None:
        """Mode ``models``: average the weights in my agent group (every ``sync.every`` versions)."""
        self.group.average_models(self.trainer.model, self.state.version)

    def publish(self, values: dict[str, float]) -> None:
        """Weights to my actors (every ``sync.weights_to_actors_every`` versions), metrics to the collector."""
        if self.weight_receivers and self.state.version % self.settings.sync.weights_to_actors_every == 0:
            self.send_weights()
        if self.evaluator is not None and self.state.version % self.settings.sync.weights_to_coordinator_every == 0:
            with self.w.timer.phase("publish"):
                weights = self.device_path.host_weights(model_of(self.trainer), self.state.version)
                self.w.control.isend(*protocol.weights(weights, self.state.version), self.evaluator)
        step, settings = self.state.step, self.settings
        if step % settings.log_every == 0 or step == settings.steps - 1:
            metrics = {
                "step": step,
                **values,
                "trajectories": self.state.produced,
                **({"skipped_steps": self.learner.skipped} if self.learner.skipped else {}),
                **self.trainer.metrics(),
            }
            self.w.reports.metrics(metrics)

    def checkpoint(self) -> None:
        """At every ``faults.checkpoint_every`` steps (not the last): the consistent cut of a periodic checkpoint."""
        every, step = self.settings.checkpoint_every, self.state.step
        if not every or step % every or step >= self.settings.steps:
            return
        if self.requests is not None:
            self.requests.settle()
        name = checkpoint_name(self.w.generation, step)
        if self.actors:
            self.w.liveness.await_named_death()  # every live actor must get the marker
        checkpoint_cut(self.w, self.buffer, self.live_actors, name)  # on the collector's rank, noted there

    def keep_alive(self) -> None:
        self.w.liveness.heartbeat(self.state.step)
        self.w.reports.tend(self.turn)  # on the collector's rank: the collector's turn

    def finish(self) -> None:
        """Settle my replies, stop my actors (no weights stay on the wire), tell my buffer I am done."""
        if self.requests is not None:
            self.requests.settle()
        if self.actors:
            self.w.liveness.await_named_death()  # every live actor must get the stop
        told = (*self.actors, *self.inference)
        drain_live(self.w, self.w.weights, told)  # room for the stop; a lost actor is not waited for
        for actor in (*self.live_actors, *self.inference):
            self.w.weights.isend(*protocol.stop(), actor)
        drain_live(self.w, self.w.weights, told)
        finish(self.w, self.buffer)

    @property
    def live_actors(self) -> list[int]:
        """My actors less those the run goes on without (``faults.on_actor_loss: continue``)."""
        return [actor for actor in self.actors if actor not in self.w.lost]

    @property
    def reachable_actors(self) -> list[int]:
        """My live actors, none while a rank's death is not yet named (:meth:`Liveness.may_send_to <gflowdist.runtime.liveness.Liveness.may_send_to>`)."""
        return [actor for actor in self.live_actors if self.w.liveness.may_send_to(actor)]

    @property
    def weight_receivers(self) -> list[int]:
        """Who gets my weights: my inference ranks when I have them (layout.inference), else my reachable actors."""
        return list(self.inference) if self.inference else self.reachable_actors

    def send_weights(self) -> None:
        """My model's weights, stamped with my policy version, to each of my (live) actors, or to my inference
        ranks instead when I have them (their actors get no weights).

        An actor whose earlier weights are all still in flight (``max_in_flight`` of the
        WEIGHTS channel) gets none this time: only the newest weights matter, and waiting
        here for a slow or dead actor would stall my training.
        """
        channel = self.w.weights
        ready = [
            a
            for a in self.weight_receivers  # a timed choice: recorded, replayed
            if not self.w.choices.decide(Site.WEIGHTS, self.turn, channel.in_flight(a) >= channel.max_in_flight, who=a)
        ]
        if not ready:
            return
        with self.w.timer.phase("publish"):  # one copy off my device, whatever the number of actors
            weights = self.device_path.host_weights(model_of(self.trainer), self.state.version)
            for actor in ready:
                channel.isend(*protocol.weights(weights, self.state.version), actor)
            if self.inference:  # my actors act through them: they only hear how far I am (their pacing)
                for actor in self.reachable_actors:  # one whose notes are all in flight gets none (recorded)
                    full = channel.in_flight(actor) >= channel.max_in_flight
                    if not self.w.choices.decide(Site.WEIGHTS, self.turn, full, who=actor):
                        channel.isend(*protocol.policy_version(self.state.version), actor)


def fresh_refusal(
    fresh: Mapping[str, torch.Tensor],
    replayed: Mapping[str, torch.Tensor] | None,
    produced: int,
    *,
    buffer: str,
    me: str,
) -> tuple[int, str] | None:
    """My buffer's refusal of my fresh batch, before I concatenate it with ``replayed``: the batch's ``seq`` (its
    first trajectory's; ``produced`` counts it already) and the refusal in the buffer's words (``buffer``, ``me``:
    the two ranks described); None when it fits."""
    refusal = refusal_before_concat(fresh, replayed)
    if refusal is None:
        return None
    n = trajectory_count(fresh)
    seq = produced - n
    return seq, refusal_text(f"buffer {buffer}", me, n, seq, refusal)
