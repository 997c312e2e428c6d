"""An actor that sends fixed-length unrolls with its behaviour policy's log-probabilities (IMPALA, APPO).

Subclass it, build ``self.model`` in :meth:`setup` (after ``super().setup()``)
and write :meth:`act`, which returns the actions and their log-probabilities
(:func:`~gflowdist.rl.unrolls.categorical_actions` and
:func:`~gflowdist.rl.unrolls.gaussian_actions` do both)::

    class MyActor(UnrollActor):
        def setup(self):
            super().setup()                      # environments, unroll state, queue pacing
            self.model = Policy(self.obs_shape[0], self.num_actions)
        def act(self, obs):                      # obs [E, *obs_shape]
            with torch.no_grad():
                return categorical_actions(self.model(obs), self.generator)

Each :meth:`rollout` steps all ``E = params.envs_per_actor`` environments
``T = params.unroll_length`` times and returns ``E`` unrolls, one per
environment copy (fields in :mod:`gflowdist.rl.unrolls`); episodes run on
across unrolls, the last observation of one unroll (its ``bootstrap_obs``)
is the first of the next. ``Discrete`` and ``Box`` action spaces are taken
(``self.discrete`` says which); :meth:`~gflowdist.rl.env_core.VectorEnvActor.metrics` reports the returns of the
episodes that ended since its last call (:class:`~gflowdist.rl.env_core.VectorEnvActor`).

Back-pressure on a queue (``replay.sampler: queue``): the learners consume
``replay.learner_batch`` unrolls per step, so actor ``a`` of the ``N``
actors feeding its buffer holds its next unroll (:meth:`rollout` returns None,
the loop keeps receiving weights and asks again) while the unrolls it sent
are at or above::

    ceil(replay.capacity / N) + (v + sync.weights_to_actors_every) * replay.learner_batch * L / N

where ``L`` is the number of trainers sampling from that buffer and ``v`` the
newest policy version it holds. So the actors together never get more than
a queue's worth ahead of the learners. With ``replay.max_staleness`` ``S`` it
also holds them at::

    (v + S + 1) * replay.learner_batch * L / N

so that no unroll it sends is learned from more than ``S`` versions after the
one that made it (the learner at version ``u`` takes, oldest first, the
unrolls numbered from ``u x learner_batch``): nothing is made only to be
dropped as stale, and ``S`` 0 keeps IMPALA on-policy (each batch made by the
policy that learns from it; the actors wait for every learner step). An actor that has waited this way for
``faults.peer_timeout_s`` seconds without its policy version moving raises
:class:`~gflowdist.errors.DeadlineError` (its learner stopped consuming).

A rollout sends ``E`` unrolls at once, so these bounds can hold every actor
back for good: with ``S`` 0, 4 actors of 8 environments and a learner batch of
16, each actor may have sent 4 unrolls at version 0, fewer than one rollout,
and the learner never gets its first batch. :meth:`setup` refuses such a
layout (:class:`~gflowdist.errors.ConfigError` naming
``replay.learner_batch`` and the numbers), rather than letting every actor
wait out its deadline.

``params`` read here (with defaults): ``env_id`` (required),
``envs_per_actor`` (1), ``unroll_length`` (20), ``record_logits`` (false),
``record_values`` (false), ``env_latency_s`` and ``env_cpu_s`` (0: a simulated
slow simulator, :mod:`gflowdist.rl.slow_env`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import torch

from gflowdist.errors import ConfigError, DeadlineError
from gflowdist.layout import Role as LayoutRole
from gflowdist.rl.env_core import VectorEnvActor
from gflowdist.rl.unrolls import UnrollRecorder

__all__ = ["UnrollActor"]


class QueuePace(NamedTuple):
    """How an unroll actor paces itself to its queue (module docstring), in unrolls."""

    ahead: float  # allowed before learning: a queue's share plus the weights' lead
    per_version: float  # the learners take this many of mine per policy version
    staleness: float  # allowed before learning by replay.max_staleness (inf: no bound)
    actors: int  # the actors feeding my buffer


class UnrollActor(VectorEnvActor):
    """Steps ``E`` environments ``T`` times per rollout; sends ``E`` unrolls (module docstring)."""

    continuous_actions = True
    unit = "unrolls"
    pace_setting = "replay.sampler: queue (its capacity paces the actors)"

    def act(self, obs: torch.Tensor) -> Mapping[str, torch.Tensor]:
        """For observations ``[E, *obs_shape]``: ``{"action": [E] int64 or [E, *action_shape] float32,
        "log_prob": [E]}``, and ``"logits"`` ``[E, A]`` / ``"value"`` ``[E]`` when recorded."""
        raise NotImplementedError(f"{type(self).__name__} must implement act(obs)")

    def actions_of(self, out: Mapping[str, torch.Tensor]) -> np.ndarray:
        """``out["action"]`` (what :meth:`act` returned), as numpy."""
        return out["action"].detach().cpu().numpy()

    def setup(self) -> None:
        params = self.params
        length = params.get("unroll_length", 20)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ConfigError(f"must be an int >= 1, got {length!r}", key="params.unroll_length")
        self.unroll_length = length
        self.setup_environments(int(params.get("envs_per_actor", 1)))
        self.recorder = UnrollRecorder(
            self.num_envs,
            length,
            self.obs_shape,
            self.action_shape,
            discrete=self.discrete,
            num_actions=self.num_actions if params.get("record_logits", False) else None,
            values=bool(params.get("record_values", False)),
        )
        self.unrolls_sent = 0
        self.pace = self._queue_pace()
        self._refuse_a_pace_that_stalls()
        self._held_since: tuple[float, int] | None = None  # (when, version) the current wait began

    def _queue_pace(self) -> QueuePace | None:
        """My pace when my buffer is a queue, else None."""
        replay, sync = getattr(self.config, "replay", None), getattr(self.config, "sync", None)
        if replay is None or replay.sampler_name != "queue" or not replay.learner_batch:
            return None
        layout, placement = getattr(self.context, "layout", None), getattr(self.context, "placement", None)
        if layout is None or placement is None or placement.buffer is None:
            actors, learners = 1, 1
        else:
            clients = layout.clients_of.get(placement.buffer, ())
            actors = max(1, sum(layout.role_of(r) is LayoutRole.ACTOR for r in clients))
            learners = max(1, sum(layout.role_of(r) is LayoutRole.TRAINER for r in clients))
        lead = sync.weights_to_actors_every if sync is not None else 1
        per_version = replay.learner_batch * learners / actors
        staleness = math.inf if replay.max_staleness is None else (replay.max_staleness + 1) * per_version
        return QueuePace(math.ceil(replay.capacity / actors) + lead * per_version, per_version, staleness, actors)

    def _refuse_a_pace_that_stalls(self) -> None:
        """Raise where the actors, each sending whole rollouts of ``E`` unrolls within :meth:`allowed`, would
        together send fewer unrolls than the learners take to reach some policy version (the actors alike)."""
        if self.pace is None:
            return
        per_version, actors, envs = self.pace.per_version, self.pace.actors, self.num_envs
        # sent by an actor by version v: whole rollouts within allowed(v); needed: per_version * (v + 1). The
        # pattern repeats with a period that divides actors * envs versions (per_version * actors is whole).
        for version in range(actors * envs):
            sendable = math.floor(self.allowed(version) / envs + 1e-9) * envs
            if sendable + 1e-9 < per_version * (version + 1):
                replay = self.config.replay
                raise ConfigError(
                    f"is {replay.learner_batch} (read by {type(self).__name__}.setup): its learners take "
                    f"{per_version:g} unrolls per policy version from each of the {actors} actor(s) of this buffer, "
                    f"and each sends whole rollouts of params.envs_per_actor = {envs}; at version {version} (within "
                    f"replay.max_staleness = {replay.max_staleness}) an actor may have sent {sendable} where the "
                    f"learners need {per_version * (version + 1):g}, so every actor would wait for good. Make "
                    f"replay.learner_batch x the buffer's learners a multiple of {actors} x {envs} (e.g. "
                    f"replay.learner_batch: {actors * envs}), or lower params.envs_per_actor",
                    key="replay.learner_batch",
                )

    def held(self, policy_version: int) -> bool:
        """Whether my next unroll would overfill my queue (module docstring); raises at the deadline."""
        if self.pace is None or self.unrolls_sent + self.num_envs <= self.allowed(policy_version):
            self._held_since = None
            return False
        now = time.monotonic()
        if self._held_since is None or self._held_since[1] != policy_version:
            self._held_since = (now, policy_version)
        deadline = float(self.config.faults.peer_timeout_s)
        if now - self._held_since[0] > deadline:
            raise DeadlineError(
                f"actor rank {self.rank} waited {deadline:g} s (faults.peer_timeout_s) for room in its queue "
                f"with policy version {policy_version}: {self.unrolls_sent} unrolls sent, the learners have "
                f"taken about {self.pace.per_version * policy_version:.0f}; they stopped consuming"
            )
        return True

    def allowed(self, policy_version: int) -> float:
        """How many unrolls I may have sent by now, at ``policy_version`` (module docstring)."""
        if self.pace is None:
            return math.inf
        return min(self.pace.ahead, self.pace.staleness) + self.pace.per_version * policy_version

    def state_dict(self) -> dict:
        """The model's, and the unrolls sent so far (the queue pacing goes on from there after a resume)."""
        return {**super().state_dict(), "unrolls_sent": self.unrolls_sent}

    def load_state_dict(self, state: Mapping) -> None:
        super().load_state_dict(state)
        self.unrolls_sent = int(state.get("unrolls_sent", self.unrolls_sent))

    def rollout(self, policy_version: int) -> dict[str, torch.Tensor] | None:
        """``E`` unrolls of ``T`` steps, or None while my queue is full (:meth:`held`)."""
        if self.held(policy_version):
            return None
        for t, (step, out) in enumerate(self.vector_steps(self.unroll_length)):
            self.recorder.record(t, step, out)
        self.unrolls_sent += self.num_envs
        # acting through an inference rank: the unrolls carry the oldest version that acted in them
        stamp = self.remote.stamp() if self.remote is not None else policy_version
        return self.recorder.take(np.asarray(self.obs), stamp)
