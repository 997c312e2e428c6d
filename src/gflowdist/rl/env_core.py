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

from collections.abc import Callable, Iterator, Mapping
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

    After :meth:`setup_environments`: ``num_envs``, ``obs`` (the current observations,
    ``[E, *obs_shape]``), ``obs_shape``, ``discrete`` and either ``num_actions``
    (``Discrete``) or ``action_shape``, ``action_low``, ``action_high`` (``Box``);
    ``groups`` (the vector environments, one unless an inference rank serves me
    with ``inference.split`` > 1: :meth:`env_split`), ``rows`` (each group's rows
    of ``obs``), ``env`` (the first group: the only one unsplit).
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

    def env_split(self, num_envs: int) -> int:
        """In how many groups my environments are stepped: ``inference.split`` when an inference rank
        serves me (``layout.inference``), else 1; it must divide ``num_envs``."""
        placement = getattr(self.context, "placement", None)
        config = getattr(self.config, "inference", None)
        if placement is None or getattr(placement, "inference", None) is None or config is None:
            return 1
        split = int(config.split)
        if num_envs % split:
            raise ConfigError(
                f"is {split}, which does not divide this actor's {num_envs} environments (params.envs_per_actor): "
                "an actor served by an inference rank steps its environments in inference.split equal groups",
                key="inference.split",
            )
        return split

    def setup_environments(self, num_envs: int) -> None:
        """Build and reset the environments (in :meth:`env_split` groups); check the action space this class
        can take."""
        self.num_envs = num_envs
        split = self.env_split(num_envs)
        size = num_envs // split
        self.groups = [self.make_env(size) for _ in range(split)]
        self.rows = [slice(g * size, (g + 1) * size) for g in range(split)]
        self.env = self.groups[0]
        self.obs_shape = tuple(self.env.single_observation_space.shape)
        self._read_action_space(self.env.single_action_space)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        # copy j of group g is seeded seed + g * size + j, as copy g * size + j of one vector environment is
        self.group_obs = [env.reset(seed=seed + g * size)[0] for g, env in enumerate(self.groups)]
        self.obs = self._joined(self.group_obs)
        self.episode_return = np.zeros(num_envs)
        self.finished_returns: list[float] = []
        self.env_steps = 0
        self.episodes = 0

    @staticmethod
    def _joined(parts: list[np.ndarray]) -> np.ndarray:
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

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
        return _joined_steps([self.step_group(g, actions[rows]) for g, rows in enumerate(self.rows)])

    def step_group(self, group: int, actions: np.ndarray) -> VectorStep:
        """One step of the environments of ``group`` (rows ``self.rows[group]``) with their ``actions``."""
        rows = self.rows[group]
        obs = self.group_obs[group]
        new_obs, reward, terminated, truncated, info = self.groups[group].step(actions)
        self.group_obs[group] = new_obs
        self.obs = self._joined(self.group_obs)
        done = np.logical_or(terminated, truncated)
        next_obs = new_obs
        if done.any():
            next_obs = new_obs.copy()
            for env in np.flatnonzero(done):
                next_obs[env] = info["final_obs"][env]
        returns = self.episode_return[rows]
        returns += reward
        self.env_steps += len(reward)
        for env in np.flatnonzero(done):
            self.finished_returns.append(float(returns[env]))
            returns[env] = 0.0
            self.episodes += 1
        return VectorStep(obs, actions, reward, next_obs, terminated, truncated)

    def vector_steps(self, count: int, *args: torch.Tensor) -> Iterator[tuple[VectorStep, Any]]:
        """``count`` steps of every environment with the policy's actions: ``(step, what the policy returned)``
        each (its actions: :meth:`actions_of`); ``args``: per-row arguments of ``act`` (``[E, ...]``).

        Acting through an inference rank with my environments in groups (:meth:`env_split` > 1), the
        groups' requests overlap: each group's request is in flight while I step the other groups, and
        every request is answered before this returns (double buffering at 2 groups)."""
        if len(self.groups) == 1 or self.remote is None:
            for _ in range(count):
                out = self.policy(self.obs_tensor(), *args)
                yield self.step_with(self.actions_of(out)), out
            return
        remote, rows = self.remote, self.rows

        def ask(group: int) -> int:
            return remote.submit(self.obs_tensor(self.group_obs[group]), *(a[rows[group]] for a in args))

        asked = [ask(g) for g in range(len(rows))]
        for t in range(count):
            steps, outs = [], []
            for g in range(len(rows)):
                out = remote.result(asked[g])
                steps.append(self.step_group(g, self.actions_of(out)))
                outs.append(out)
                if t + 1 < count:
                    asked[g] = ask(g)
            yield _joined_steps(steps), _joined_outputs(outs)

    def policy(self, obs: torch.Tensor, *args: torch.Tensor) -> Any:
        """``act(obs, *args)``, run here, or on my inference rank when I have one (``layout.inference``:
        ``self.remote``, set by the actor loop), batched there with other actors' requests."""
        if self.remote is not None:
            return self.remote(obs, *args)
        return self.act(obs, *args)  # type: ignore[attr-defined]

    def actions_of(self, out: Any) -> np.ndarray:
        """The actions in what :meth:`policy` returned (default: it is the actions tensor)."""
        return out.detach().cpu().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)

    def obs_tensor(self, obs: np.ndarray | None = None) -> torch.Tensor:
        """``obs`` (default: the current observations) as a float32 tensor ``[E, *obs_shape]``."""
        return torch.from_numpy(np.asarray(self.obs if obs is None else obs, dtype=np.float32))

    def metrics(self) -> dict[str, float]:
        """``env_steps``, ``episodes`` so far (ints: the progress line adds them up over the actors);
        ``episode_return``: mean over episodes ended since the last call (absent when none ended);
        ``env_wait_s``: seconds waited in simulated slow steps so far (only with ``params.env_latency_s``)."""
        out: dict[str, float] = {"env_steps": int(self.env_steps), "episodes": int(self.episodes)}
        copies = [env for group in self.groups for env in getattr(group, "envs", ())]
        waited = [env.cost.waited_s for env in copies if hasattr(env, "cost")]
        if any(waited):
            out["env_wait_s"] = float(sum(waited))
        if self.finished_returns:
            out["episode_return"] = float(np.mean(self.finished_returns))
            self.finished_returns = []
        return out


def _joined_steps(parts: list[VectorStep]) -> VectorStep:
    """The groups' steps as one step of every environment (groups in row order)."""
    if len(parts) == 1:
        return parts[0]
    return VectorStep(*(np.concatenate([getattr(p, f) for p in parts]) for f in VectorStep.__dataclass_fields__))


def _joined_outputs(parts: list[Any]) -> Any:
    """The policy's outputs for the groups as one output for every environment (tensors, or mappings of them)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], Mapping):
        return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    return torch.cat(parts)
