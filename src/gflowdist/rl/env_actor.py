"""An :class:`~gflowdist.runtime.roles.Actor` that steps a gymnasium vector environment and emits
n-step transitions (discrete actions only; the stepping core is :mod:`gflowdist.rl.env_core`).

Subclass it, build ``self.model`` in :meth:`setup` (after ``super().setup()``)
and write :meth:`act`; gflowdist runs it as any actor (weights from its
learner, stamped versions, the ledger counts transitions)::

    class MyActor(EnvironmentActor):
        def setup(self):
            super().setup()                       # environments, n-step state, epsilons
            self.model = QNetwork(self.obs_shape[0], self.num_actions)
        def act(self, obs, epsilon):              # obs [E, *obs_shape] -> actions [E]
            with torch.no_grad():
                return epsilon_greedy(self.model(obs), epsilon, self.generator)

Each :meth:`rollout` steps all ``E = params.envs_per_actor`` environments
``params.rollout_steps`` times and returns the n-step transitions that
became complete (fields in :mod:`gflowdist.rl.transitions`). Episodes run
on across rollouts; :meth:`~gflowdist.rl.env_core.VectorEnvActor.metrics` reports the returns of the episodes
that ended since its last call.

Exploration: environment ``j`` of actor ``a`` (of ``N`` actors with ``E``
environments each) is rung ``a * E + j`` of Ape-X's ladder of ``N * E``
epsilons (:func:`gflowdist.rl.exploration.apex_epsilons`); ``self.epsilon``
holds this actor's ``E`` values.

Pacing (optional): with ``params.env_steps_per_update = r`` the ``N``
actors together take about ``r`` environment steps per learner step. Actor
``a`` lets :meth:`rollout` return None (the loop keeps receiving weights and
asks again) while its own step count is at or above::

    ceil(replay.min_size_to_sample / N) + (r / N) * (v + sync.weights_to_actors_every)

where ``v`` is the policy version of the newest weights it holds (the
learner's step, known up to ``weights_to_actors_every`` steps late). Without
it, actors run flat out as in Ape-X.

``params`` read here (with defaults): ``env_id`` (required),
``envs_per_actor`` (1), ``rollout_steps`` (16), ``n_step`` (1), ``gamma``
(0.99), ``epsilon`` (0.4), ``epsilon_alpha`` (7.0), ``env_steps_per_update``
(None), ``env_latency_s`` and ``env_cpu_s`` (0: a simulated slow simulator,
:mod:`gflowdist.rl.slow_env`).
"""

from __future__ import annotations

import math

import torch

from gflowdist.errors import ConfigError
from gflowdist.rl.env_core import VectorEnvActor, make_vector_env
from gflowdist.rl.exploration import apex_epsilons
from gflowdist.rl.transitions import NStepTransitions

__all__ = ["EnvironmentActor", "make_vector_env"]


class EnvironmentActor(VectorEnvActor):
    """Steps a vector of environments; emits n-step transitions (see the module docstring)."""

    unit = "transitions"
    pace_setting = "params.env_steps_per_update"

    def act(self, obs: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
        """Actions (int64 ``[E]``) for observations ``[E, *obs_shape]`` at exploration ``epsilon``."""
        raise NotImplementedError(f"{type(self).__name__} must implement act(obs, epsilon)")

    def setup(self) -> None:
        params = self.params
        self.rollout_steps = int(params.get("rollout_steps", 16))
        self.setup_environments(int(params.get("envs_per_actor", 1)))
        index, actors = self.actor_slot()
        self.epsilon = apex_epsilons(
            index * self.num_envs,
            self.num_envs,
            actors * self.num_envs,
            float(params.get("epsilon", 0.4)),
            float(params.get("epsilon_alpha", 7.0)),
        )
        self.transitions = NStepTransitions(
            self.num_envs, int(params.get("n_step", 1)), float(params.get("gamma", 0.99)), self.obs_shape
        )
        self.pace = self._pace(params, actors)

    def _pace(self, params, actors: int) -> tuple[float, float] | None:
        """``(steps allowed before learning starts, steps per learner step)`` of this actor."""
        rate = params.get("env_steps_per_update")
        if rate is None:
            return None
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ConfigError(f"must be a number > 0 or null, got {rate!r}", key="params.env_steps_per_update")
        replay, sync = getattr(self.config, "replay", None), getattr(self.config, "sync", None)
        lead = sync.weights_to_actors_every if sync is not None else 1
        warmup = math.ceil(replay.min_size_to_sample / actors) if replay is not None else 0
        return warmup + lead * rate / actors, rate / actors

    def paced(self, policy_version: int) -> bool:
        """Whether this actor is ahead of its learner (see the module docstring)."""
        return self.pace is not None and self.env_steps >= self.pace[0] + self.pace[1] * policy_version

    def rollout(self, policy_version: int) -> dict[str, torch.Tensor] | None:
        """:meth:`collect`, or None while the actor is ahead of its learner (:meth:`paced`)."""
        return None if self.paced(policy_version) else self.collect()

    def collect(self) -> dict[str, torch.Tensor]:
        """Step every environment ``rollout_steps`` times with :meth:`act`'s actions; the transitions that became
        complete."""
        for step, _ in self.vector_steps(self.rollout_steps, self.epsilon):
            self.transitions.push(step.obs, step.action, step.reward, step.next_obs, step.terminated, step.truncated)
        return self.transitions.take()
