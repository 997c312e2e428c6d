"""n-step transitions from a vector of environments.

:class:`NStepTransitions` turns the per-step output of ``E`` environments
into n-step transitions, one per environment step, each a row of::

    obs        float32 [*obs_shape]  s_t
    action     int64   []            a_t
    reward     float32 []            R = r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}
    next_obs   float32 [*obs_shape]  s_{t+k}
    terminated bool    []            s_{t+k} is terminal (no bootstrap)
    truncated  bool    []            the episode was cut at s_{t+k} (time limit): bootstrap
    discount   float32 []            gamma^k, the factor of the bootstrap value

``k = n`` in the middle of an episode; when an episode ends after fewer
than ``n`` further steps, its last transitions are emitted with the ``k``
that remained. A one-step target is then
``reward + discount * (1 - terminated) * V(next_obs)``, for any ``n``.

Steps are held per environment until their ``n`` rewards are known, so a
transition may come out in a later :meth:`push` than the step it starts at
(episode state is kept across rollouts). Nothing is emitted twice, and every
step of a finished episode is emitted by the step that finished it.
"""

from __future__ import annotations

import numpy as np
import torch

from gflowdist.errors import ConfigError

__all__ = ["NStepTransitions", "TRANSITION_FIELDS"]

TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "discount")


class NStepTransitions:
    """n-step accumulator for ``num_envs`` environments (see the module docstring)."""

    def __init__(self, num_envs: int, n: int, gamma: float, obs_shape: tuple[int, ...]):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"must be an int >= 1, got {n!r}", key="params.n_step")
        if not (isinstance(gamma, (int, float)) and 0.0 <= gamma <= 1.0):
            raise ConfigError(f"must be in [0, 1], got {gamma!r}", key="params.gamma")
        self.n, self.gamma = n, float(gamma)
        self.powers = self.gamma ** np.arange(n + 1)
        self.obs = np.zeros((num_envs, n, *obs_shape), dtype=np.float32)
        self.action = np.zeros((num_envs, n), dtype=np.int64)
        self.reward = np.zeros((num_envs, n), dtype=np.float64)
        self.fill = np.zeros(num_envs, dtype=np.int64)
        self._rows: list[dict[str, np.ndarray]] = []

    def push(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """One vector step: ``next_obs`` is the true next observation (the final one at an end)."""
        envs = np.arange(self.fill.size)
        self.obs[envs, self.fill] = obs
        self.action[envs, self.fill] = action
        self.reward[envs, self.fill] = reward
        self.fill += 1
        done = np.logical_or(terminated, truncated)
        full = np.flatnonzero((self.fill == self.n) & ~done)
        if full.size:
            self._emit_oldest(full, next_obs[full])
        for env in np.flatnonzero(done):
            self._emit_episode_end(int(env), next_obs[env], bool(terminated[env]), bool(truncated[env]))

    def _emit_oldest(self, envs: np.ndarray, next_obs: np.ndarray) -> None:
        """The oldest pending step of each of ``envs`` has its ``n`` rewards: emit, shift."""
        count = envs.size
        self._rows.append(
            {
                "obs": self.obs[envs, 0].copy(),
                "action": self.action[envs, 0].copy(),
                "reward": self.reward[envs] @ self.powers[: self.n],
                "next_obs": next_obs.copy(),
                "terminated": np.zeros(count, dtype=bool),
                "truncated": np.zeros(count, dtype=bool),
                "discount": np.full(count, self.powers[self.n]),
            }
        )
        for held in (self.obs, self.action, self.reward):
            held[envs, :-1] = held[envs, 1:]
        self.fill[envs] -= 1

    def _emit_episode_end(self, env: int, final_obs: np.ndarray, terminated: bool, truncated: bool) -> None:
        """Every pending step of ``env``: its rewards up to the episode's end."""
        k = int(self.fill[env])
        rewards = self.reward[env, :k]
        returns = np.array([rewards[i:] @ self.powers[: k - i] for i in range(k)])
        self._rows.append(
            {
                "obs": self.obs[env, :k].copy(),
                "action": self.action[env, :k].copy(),
                "reward": returns,
                "next_obs": np.repeat(final_obs[None], k, axis=0),
                "terminated": np.full(k, terminated),
                "truncated": np.full(k, truncated),
                "discount": self.powers[k - np.arange(k)],
            }
        )
        self.fill[env] = 0

    def __len__(self) -> int:
        """Transitions emitted and not yet taken."""
        return sum(len(rows["action"]) for rows in self._rows)

    def take(self) -> dict[str, torch.Tensor]:
        """Every transition emitted since the last call, as a batch of tensors (maybe empty)."""
        rows, self._rows = self._rows, []
        if not rows:
            shape = self.obs.shape[2:]
            return {
                "obs": torch.zeros((0, *shape)),
                "action": torch.zeros(0, dtype=torch.int64),
                "reward": torch.zeros(0),
                "next_obs": torch.zeros((0, *shape)),
                "terminated": torch.zeros(0, dtype=torch.bool),
                "truncated": torch.zeros(0, dtype=torch.bool),
                "discount": torch.zeros(0),
            }
        batch = {name: np.concatenate([r[name] for r in rows]) for name in TRANSITION_FIELDS}
        out = {name: torch.from_numpy(batch[name]) for name in TRANSITION_FIELDS}
        for name in ("obs", "reward", "next_obs", "discount"):
            out[name] = out[name].to(torch.float32)
        return out
