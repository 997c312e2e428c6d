"""An :class:`~gflowdist.runtime.roles.Actor` that steps a gymnasium vector environment.

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
on across rollouts; :meth:`metrics` reports the returns of the episodes
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
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gflowdist.errors import ConfigError
from gflowdist.layout import Role as LayoutRole
from gflowdist.rl.exploration import apex_epsilons
from gflowdist.rl.transitions import NStepTransitions
from gflowdist.runtime.roles import Actor

__all__ = ["EnvironmentActor", "make_vector_env"]


def make_vector_env(env_id: str, num_envs: int, wrapper: Callable[[Any], Any] | None = None) -> Any:
    """``num_envs`` copies of ``env_id`` stepped in this process, one after another; ends reset in the
    same step (the final observation is in ``info["final_obs"]``); ``wrapper`` wraps each copy."""
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError("environment actors need gymnasium: pip install 'gflowdist[rl]'") from err
    return gymnasium.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
        wrappers=[wrapper] if wrapper is not None else None,
    )


class EnvironmentActor(Actor):
    """Steps a vector of environments; emits n-step transitions (see the module docstring)."""

    def act(self, obs: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
        """Actions (int64 ``[E]``) for observations ``[E, *obs_shape]`` at exploration ``epsilon``."""
        raise NotImplementedError(f"{type(self).__name__} must implement act(obs, epsilon)")

    def make_env(self, num_envs: int) -> Any:
        """The vector environment (default: :func:`make_vector_env` of ``params.env_id``, each copy
        slowed by ``params.env_latency_s`` / ``params.env_cpu_s`` when set: :mod:`gflowdist.rl.slow_env`)."""
        if "env_id" not in self.params:
            raise ConfigError("is required by an environment actor (e.g. CartPole-v1)", key="params.env_id")
        from gflowdist.rl.slow_env import slow_env_wrapper  # imports gymnasium (the rl extra)

        return make_vector_env(str(self.params["env_id"]), num_envs, slow_env_wrapper(self.params))

    def actor_slot(self) -> tuple[int, int]:
        """``(my index among the actors, number of actors)``; ``(0, 1)`` outside a job."""
        layout = getattr(self.context, "layout", None)
        if layout is None:
            return 0, 1
        actors = layout.ranks_of(LayoutRole.ACTOR)
        return (actors.index(self.rank), len(actors)) if self.rank in actors else (0, 1)

    def setup(self) -> None:
        params = self.params
        self.num_envs = int(params.get("envs_per_actor", 1))
        self.rollout_steps = int(params.get("rollout_steps", 16))
        self.env = self.make_env(self.num_envs)
        self.obs_shape = tuple(self.env.single_observation_space.shape)
        self.num_actions = int(self.env.single_action_space.n)
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
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = np.zeros(self.num_envs)
        self.finished_returns: list[float] = []
        self.env_steps = 0
        self.episodes = 0
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
        """Step every environment ``rollout_steps`` times; the transitions that became complete."""
        for _ in range(self.rollout_steps):
            self.step_environments()
        return self.transitions.take()

    def step_environments(self) -> None:
        """One step of every environment with :meth:`act`'s actions."""
        obs = self.obs
        actions = self.act(torch.from_numpy(np.asarray(obs, dtype=np.float32)), self.epsilon).numpy()
        self.obs, reward, terminated, truncated, info = self.env.step(actions)
        done = np.logical_or(terminated, truncated)
        next_obs = self.obs
        if done.any():
            next_obs = self.obs.copy()
            for env in np.flatnonzero(done):
                next_obs[env] = info["final_obs"][env]
        self.transitions.push(obs, actions, reward, next_obs, terminated, truncated)
        self.episode_return += reward
        self.env_steps += self.num_envs
        for env in np.flatnonzero(done):
            self.finished_returns.append(float(self.episode_return[env]))
            self.episode_return[env] = 0.0
            self.episodes += 1

    def metrics(self) -> dict[str, float]:
        """``env_steps``, ``episodes`` so far (ints: the progress line adds them up over the actors);
        ``episode_return``: mean over episodes ended since the last call (absent when none ended)."""
        out: dict[str, float] = {"env_steps": int(self.env_steps), "episodes": int(self.episodes)}
        if self.finished_returns:
            out["episode_return"] = float(np.mean(self.finished_returns))
            self.finished_returns = []
        return out
