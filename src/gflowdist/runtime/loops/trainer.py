"""The trainer's loop: a short sequence of named steps, repeated ``run.steps`` times.

    align with my agent group, weights to my actors
    per step: rollout -> ship -> replayed -> learn -> sync -> publish -> checkpoint -> keep alive
    settle what my buffer still owes me, stop my actors, finish

Each step is a method of :class:`TrainerLoop`; the user's code runs in
``rollout`` (:meth:`Actor.rollout`) and ``learn`` (:meth:`Trainer.loss`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from gflowdist.runtime import protocol
from gflowdist.runtime.checkpoints import checkpoint_name
from gflowdist.runtime.loops.agent_group import AgentGroup
from gflowdist.runtime.loops.client import (checkpoint_cut, concat_batches, finish, reply_from, ship,
                                             trajectory_count, use_locally)
from gflowdist.runtime.roles import Trainer
from gflowdist.runtime.state import TrainerState
from gflowdist.runtime.wiring import Wiring

if TYPE_CHECKING:
    from gflowdist.runtime.collector import Collector

__all__ = ["run_trainer", "TrainerLoop", "ReplayRequests"]


def run_trainer(trainer: Trainer, w: Wiring, state: TrainerState, collector: Collector | None = None) -> TrainerState:
    """Run the trainer loop until ``run.steps`` or a stop; ``state`` is updated in place and returned."""
    TrainerLoop(trainer, w, state, collector).run()
    return state


class ReplayRequests:
    """Sample requests to my buffer, kept ``replay.prefetch`` ahead of use (replies arrive in order).

    Each asks for this step's share, ``replay.replayed_per_step(fresh)``. With
    ``prefetch`` 0 each step asks and waits; with ``prefetch`` k the reply used
    at a step was asked for k steps earlier, and the first steps learn from
    fresh trajectories only.
    """

    def __init__(self, w: Wiring, buffer: int):
        self.w = w
        self.buffer = buffer
        self.prefetch = w.config.replay.prefetch
        self.outstanding = 0

    def take(self, state: TrainerState, fresh: int) -> dict | None:
        """The replayed batch for this step (None: nothing asked yet, or my buffer had too little)."""
        w, replayed = self.w, None
        per_step = w.config.replay.replayed_per_step(fresh)
        if self.outstanding == 0 and self.prefetch == 0:
            self._ask(per_step, state.version)
        if self.outstanding:
            with w.timer.phase("wait_replay"), w.timer.wait_on(self.buffer, "replay"):
                reply = reply_from(w, self.buffer, w.config.faults.peer_timeout_s)
            self.outstanding -= 1
            if reply.body.get("batch") is not None:
                replayed = reply.body["batch"]
                state.staleness.update((state.version - reply.body["versions"]).tolist())
        while self.outstanding < self.prefetch:
            self._ask(per_step, state.version)
        return replayed

    def settle(self) -> None:
        """Read (and drop) every reply still owed, so none is in flight across a checkpoint cut or the end."""
        for _ in range(self.outstanding):
            reply_from(self.w, self.buffer, self.w.config.faults.peer_timeout_s)
        self.outstanding = 0

    def _ask(self, n: int, version: int) -> None:
        self.w.data.isend(*protocol.sample_request(n, version), self.buffer)
        self.outstanding += 1


class TrainerLoop:
    """One trainer's loop: its collaborators, and one method per step."""

    def __init__(self, trainer: Trainer, w: Wiring, state: TrainerState, collector: Collector | None):
        self.trainer, self.w, self.state, self.collector = trainer, w, state, collector
        self.config = w.config
        placement = w.context.placement
        self.buffer, self.actors = placement.buffer, placement.actors
        self.group = AgentGroup(w.context.agent_group, self.config.sync, w.timer)
        replays = self.buffer is not None and self.config.replay.replay_fraction > 0
        self.requests = ReplayRequests(w, self.buffer) if replays else None

    def run(self) -> None:
        self.group.align(self.trainer.model)
        self.send_weights()
        while self.state.step < self.config.run.steps and not self.group.agree_to_stop(self.w):
            fresh = self.rollout()
            self.ship(fresh)
            loss = self.learn(concat_batches(fresh, self.replayed(fresh)))
            self.sync()
            self.publish(loss)
            self.state.step += 1
            self.checkpoint()
            self.keep_alive()
        self.finish()

    # -- the steps, in order ------------------------------------------------------------------
    def rollout(self) -> dict:
        with self.w.timer.phase("rollout"):
            return self.trainer.rollout(self.state.version)

    def ship(self, fresh: dict) -> None:
        """Fresh trajectories to my buffer (or counted as used here, without one)."""
        if self.buffer is None:
            use_locally(self.w, fresh, self.state)
            return
        with self.w.timer.phase("send"):
            ship(self.w, fresh, self.state, self.buffer)

    def replayed(self, fresh: dict) -> dict | None:
        """This step's replayed trajectories (``replay.replay_fraction`` of the batch), if any."""
        return self.requests.take(self.state, trajectory_count(fresh)) if self.requests is not None else None

    def learn(self, batch: dict) -> torch.Tensor:
        """loss -> backward -> gradients averaged in my agent group -> optimizer step -> version + 1."""
        trainer, timer = self.trainer, self.w.timer
        with timer.phase("loss"):
            trainer.optimizer.zero_grad(set_to_none=True)
            loss = trainer.loss(batch)
            loss.backward()
        self.group.average_gradients(trainer.model)
        with timer.phase("optimizer"):
            trainer.optimizer.step()
        self.state.version += 1
        return loss

    def sync(self) -> None:
        """Mode ``models``: average the weights in my agent group (every ``sync.every`` versions)."""
        self.group.average_models(self.trainer.model, self.state.version)

    def publish(self, loss: torch.Tensor) -> None:
        """Weights to my actors (every ``sync.weights_to_actors_every`` versions), metrics to the collector."""
        if self.actors and self.state.version % self.config.sync.weights_to_actors_every == 0:
            self.send_weights()
        step, run = self.state.step, self.config.run
        if step % run.log_every == 0 or step == run.steps - 1:
            metrics = {"step": step, "loss": float(loss.detach()), "trajectories": self.state.produced,
                       **self.trainer.metrics()}
            if self.collector is not None:
                self.collector.record_metrics(self.w.rank, metrics)
            else:
                self.w.report(protocol.metrics(metrics))

    def checkpoint(self) -> None:
        """At every ``faults.checkpoint_every`` steps (not the last): the consistent cut of a periodic checkpoint."""
        every, step = self.config.faults.checkpoint_every, self.state.step
        if not every or step % every or step >= self.config.run.steps:
            return
        if self.requests is not None:
            self.requests.settle()
        name = checkpoint_name(self.w.generation, step)
        file = checkpoint_cut(self.w, self.buffer, self.actors, name)
        if self.collector is not None and file is not None:  # I am the collector: note my own part
            self.collector.note_saved(name, self.w.rank, file)

    def keep_alive(self) -> None:
        self.w.heartbeat(self.state.step)
        if self.collector is not None:
            self.collector.poll()
            self.collector.progress()

    def finish(self) -> None:
        """Settle my replies, stop my actors (no weights stay on the wire), tell my buffer I am done."""
        if self.requests is not None:
            self.requests.settle()
        for actor in self.actors:
            self.w.weights.isend(*protocol.stop(), actor)
        self.w.weights.drain()
        finish(self.w, self.buffer)

    def send_weights(self) -> None:
        """My model's weights, stamped with my policy version, to each of my actors."""
        if not self.actors:
            return
        weights = {k: v.detach() for k, v in self.trainer.model.state_dict().items()}
        for actor in self.actors:
            self.w.weights.isend(*protocol.weights(weights, self.state.version), actor)
