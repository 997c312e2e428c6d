"""The environment-stepping core every environment actor shares: :class:`VectorEnvActor`.

It owns ``E = params.envs_per_actor`` copies of ``params.env_id`` in one
gymnasium vector environment (extra ``rl``: ``pip install 'gflowdist[rl]'``),
keeps episodes running across rollouts, counts environment steps and
episodes and reports episode returns as :meth:`VectorEnvActor.metrics`. What an actor makes
of the steps is its subclass's business:

- :class:`~gflowdist.rl.env_actor.EnvironmentActor`: n-step transitions (Ape-X, DQN);
- :class:`~gflowdist.rl.unroll_actor.UnrollActor`: fixed-length unrolls with the
  behaviour policy's log-probabilities (IMPALA, PPO with actors).

A subclass calls :meth:`step_with` with the actions of one vector step and gets
back a :class:`VectorStep` (the observations acted on, the rewards, the true next
observations: the final one where an episode ended).

Action spaces: ``Discrete`` for every actor; ``Box`` (continuous) only for an
actor class with ``continuous_actions = True``. Any other space, or a ``Box``
given to a discrete-only actor, is refused in :meth:`VectorEnvActor.setup_environments` naming the class,
the environment and its action space.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from gflowdist.errors import ConfigError
from gflowdist.layout import Role as LayoutRole
from gflowdist.runtime.roles import Actor

__all__ = ["VectorEnvActor", "VectorStep", "make_vector_env"]


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


@dataclass(frozen=True)
class VectorStep:
    """One step of ``E`` environments (numpy arrays, one row per environment)."""

    obs: np.ndarray  #: the observations acted on
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray  #: the true next observations: the final one where an episode ended
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def done(self) -> np.ndarray:
        return np.logical_or(self.terminated, self.truncated)


class VectorEnvActor(Actor):
    """Steps ``E`` environment copies; episode returns as metrics (see the module docstring).

    After :meth:`setup_environments`: ``env``, ``num_envs``, ``obs`` (the current observations,
    ``[E, *obs_shape]``), ``obs_shape``, ``discrete`` and either ``num_actions``
    (``Discrete``) or ``action_shape``, ``action_low``, ``action_high`` (``Box``).
    """

    #: whether this actor takes ``Box`` action spaces (``Discrete`` ones are always taken)
    continuous_actions: ClassVar[bool] = False

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

    def setup_environments(self, num_envs: int) -> None:
        """Build and reset the environments; check the action space this class can take."""
        self.num_envs = num_envs
        self.env = self.make_env(num_envs)
        self.obs_shape = tuple(self.env.single_observation_space.shape)
        self._read_action_space(self.env.single_action_space)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return = np.zeros(num_envs)
        self.finished_returns: list[float] = []
        self.env_steps = 0
        self.episodes = 0

    def _read_action_space(self, space: Any) -> None:
        from gymnasium import spaces

        env_id = self.params.get("env_id", "the environment")
        self.num_actions: int | None
        self.action_shape: tuple[int, ...]
        if isinstance(space, spaces.Discrete):
            self.discrete, self.num_actions, self.action_shape = True, int(space.n), ()
            return
        if isinstance(space, spaces.Box) and self.continuous_actions:
            self.discrete, self.num_actions, self.action_shape = False, None, tuple(space.shape)
            self.action_low, self.action_high = space.low, space.high
            return
        takes = "Discrete or Box" if self.continuous_actions else "only Discrete"
        hint = (
            "; for continuous actions use gflowdist.rl.UnrollActor"
            if isinstance(space, spaces.Box) and not self.continuous_actions
            else ""
        )
        raise ConfigError(
            f"{type(self).__name__} takes {takes} action spaces, and {env_id} has action space {space}{hint}",
            key="params.env_id",
        )

    def step_with(self, actions: np.ndarray) -> VectorStep:
        """One step of every environment with ``actions`` (``[E]`` ints or ``[E, *action_shape]`` floats)."""
        obs = self.obs
        self.obs, reward, terminated, truncated, info = self.env.step(actions)
        done = np.logical_or(terminated, truncated)
        next_obs = self.obs
        if done.any():
            next_obs = self.obs.copy()
            for env in np.flatnonzero(done):
                next_obs[env] = info["final_obs"][env]
        self.episode_return += reward
        self.env_steps += self.num_envs
        for env in np.flatnonzero(done):
            self.finished_returns.append(float(self.episode_return[env]))
            self.episode_return[env] = 0.0
            self.episodes += 1
        return VectorStep(obs, actions, reward, next_obs, terminated, truncated)

    def policy(self, obs: torch.Tensor, *args: torch.Tensor) -> Any:
        """``act(obs, *args)``, run here, or on my inference rank when I have one (``layout.inference``:
        ``self.remote``, set by the actor loop), batched there with other actors' requests."""
        if self.remote is not None:
            return self.remote(obs, *args)
        return self.act(obs, *args)  # type: ignore[attr-defined]

    def obs_tensor(self, obs: np.ndarray | None = None) -> torch.Tensor:
        """``obs`` (default: the current observations) as a float32 tensor ``[E, *obs_shape]``."""
        return torch.from_numpy(np.asarray(self.obs if obs is None else obs, dtype=np.float32))

    def metrics(self) -> dict[str, float]:
        """``env_steps``, ``episodes`` so far (ints: the progress line adds them up over the actors);
        ``episode_return``: mean over episodes ended since the last call (absent when none ended);
        ``env_wait_s``: seconds waited in simulated slow steps so far (only with ``params.env_latency_s``)."""
        out: dict[str, float] = {"env_steps": int(self.env_steps), "episodes": int(self.episodes)}
        waited = [env.cost.waited_s for env in getattr(self.env, "envs", ()) if hasattr(env, "cost")]
        if any(waited):
            out["env_wait_s"] = float(sum(waited))
        if self.finished_returns:
            out["episode_return"] = float(np.mean(self.finished_returns))
            self.finished_returns = []
        return out
