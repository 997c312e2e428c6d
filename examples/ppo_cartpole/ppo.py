"""PPO (Schulman et al. 2017) in plain torch: what the distributed run and the single process share.

- :class:`ActorCritic`: separate policy and value MLPs; a categorical policy for a
  ``Discrete`` action space, a Gaussian one (state-independent log std) for a ``Box``.
- :class:`Rollouts`: ``E`` environment copies (:func:`gflowdist.rl.make_vector_env`)
  stepped ``T`` times with the current policy; GAE (:func:`gflowdist.rl.gae`,
  truncated episodes bootstrapped from their cut observation) gives advantages and
  value targets; returns ``T x E`` items, the fields PPO's loss reads.
- :func:`ppo_loss`: the clipped surrogate, the value loss and the entropy bonus, with
  the named values a PPO run watches (``policy_loss``, ``value_loss``, ``entropy``,
  ``approx_kl``, ``clip_fraction``) beside ``loss``.
- :func:`evaluate`: the greedy (discrete) or mean (Gaussian) policy's mean return.

``params`` read (defaults): ``env_id``, ``envs`` (8 per trainer), ``unroll`` (128
steps), ``hidden`` (64), ``gamma`` (0.99), ``lam`` (0.95), ``clip`` (0.2),
``value_coef`` (0.5), ``entropy_coef`` (0.0), ``lr`` (3e-4), ``lr_anneal`` (false:
linear to 0 over ``run.steps``), ``reward_scale`` (1.0), ``init_log_std`` (0.0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from gflowdist.rl import gae, make_vector_env

__all__ = ["ActorCritic", "Rollouts", "ppo_loss", "evaluate", "env_spaces", "make_model", "make_optimizer"]


def env_spaces(env_id: str) -> tuple[int, int, bool, tuple[np.ndarray, np.ndarray] | None]:
    """``(observation size, action count or size, discrete, (low, high) of a Box)`` of ``env_id``."""
    env = make_vector_env(env_id, 1)
    obs = int(env.single_observation_space.shape[0])
    space = env.single_action_space
    env.close()
    if hasattr(space, "n"):
        return obs, int(space.n), True, None
    return obs, int(space.shape[0]), False, (space.low.astype(np.float32), space.high.astype(np.float32))


def _mlp(inputs: int, hidden: int, outputs: int, gain: float) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
    last = nn.Linear(hidden, outputs)
    for layer in [*net[::2], last]:
        nn.init.orthogonal_(layer.weight, math.sqrt(2) if layer is not last else gain)
        nn.init.zeros_(layer.bias)
    return nn.Sequential(*net, last)


class ActorCritic(nn.Module):
    """Policy and value function as separate MLPs (tanh, orthogonal initialisation)."""

    def __init__(self, obs: int, actions: int, discrete: bool, hidden: int = 64, init_log_std: float = 0.0):
        super().__init__()
        self.discrete = discrete
        self.policy = _mlp(obs, hidden, actions, 0.01)
        self.value = _mlp(obs, hidden, 1, 1.0)
        if not discrete:
            self.log_std = nn.Parameter(torch.full((actions,), float(init_log_std)))

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.policy(obs)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))

    def log_prob(self, dist: torch.distributions.Distribution, action: torch.Tensor) -> torch.Tensor:
        logp = dist.log_prob(action)
        return logp if self.discrete else logp.sum(-1)

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``(actions, their log-probabilities)`` drawn with ``generator``."""
        dist = self.distribution(obs)
        if self.discrete:
            action = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
        else:
            action = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator)
        return action, self.log_prob(dist, action)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.policy(obs)
        return out.argmax(-1) if self.discrete else out


def make_model(params: Mapping[str, Any]) -> ActorCritic:
    obs, actions, discrete, _ = env_spaces(str(params["env_id"]))
    return ActorCritic(obs, actions, discrete, int(params.get("hidden", 64)), float(params.get("init_log_std", 0.0)))


def make_optimizer(
    model: nn.Module, params: Mapping[str, Any], total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
    """Adam (eps 1e-5) and, with ``params.lr_anneal``, a linear decay to 0 over ``total_steps`` trainer steps."""
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params.get("lr", 3e-4)), eps=1e-5)
    if not params.get("lr_anneal", False):
        return optimizer, None
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / total_steps))


class Rollouts:
    """``envs`` copies of ``params.env_id`` stepped ``params.unroll`` times per :meth:`collect`; episodes run on."""

    def __init__(self, params: Mapping[str, Any], envs: int, seed: int, generator: torch.Generator):
        self.envs, self.unroll = envs, int(params.get("unroll", 128))
        self.gamma, self.lam = float(params.get("gamma", 0.99)), float(params.get("lam", 0.95))
        self.reward_scale = float(params.get("reward_scale", 1.0))
        self.env = make_vector_env(str(params["env_id"]), envs)
        _, _, self.discrete, self.bounds = env_spaces(str(params["env_id"]))
        self.generator = generator
        self.obs, _ = self.env.reset(seed=seed)
        self.running = np.zeros(envs)
        self.finished: list[float] = []
        self.env_steps = 0
        self.episodes = 0

    def collect(self, model: ActorCritic) -> dict[str, torch.Tensor]:
        """``unroll x envs`` items: obs, action, logp (behaviour), value, advantage, ret (value target)."""
        steps, envs = self.unroll, self.envs
        obs_t = torch.zeros(steps, envs, *self.obs.shape[1:])
        rewards, values, logps = torch.zeros(steps, envs), torch.zeros(steps, envs), torch.zeros(steps, envs)
        terminated = torch.zeros(steps, envs, dtype=torch.bool)
        truncated = torch.zeros(steps, envs, dtype=torch.bool)
        cut_values = torch.zeros(steps, envs)
        actions = []
        with torch.no_grad():
            for t in range(steps):
                obs = torch.as_tensor(np.asarray(self.obs, dtype=np.float32))
                action, logp = model.sample(obs, self.generator)
                obs_t[t], logps[t], values[t] = obs, logp, model.value(obs).squeeze(-1)
                actions.append(action)
                env_action = action.numpy()
                if self.bounds is not None:
                    env_action = np.clip(env_action, *self.bounds)
                self.obs, reward, term, trunc, info = self.env.step(env_action)
                rewards[t] = torch.as_tensor(reward, dtype=torch.float32) * self.reward_scale
                terminated[t], truncated[t] = torch.as_tensor(term), torch.as_tensor(trunc)
                cut = np.flatnonzero(np.logical_and(trunc, ~term))
                if len(cut):
                    final = np.stack([info["final_obs"][e] for e in cut]).astype(np.float32)
                    cut_values[t, torch.as_tensor(cut)] = model.value(torch.from_numpy(final)).squeeze(-1)
                self._count(reward, np.logical_or(term, trunc))
            bootstrap = model.value(torch.as_tensor(np.asarray(self.obs, dtype=np.float32))).squeeze(-1)
        advantages, returns = gae(
            rewards,
            values,
            bootstrap,
            terminated,
            gamma=self.gamma,
            lam=self.lam,
            truncated=truncated & ~terminated,
            truncation_values=cut_values,
        )
        flat = lambda x: x.reshape(steps * envs, *x.shape[2:])  # noqa: E731
        return {
            "obs": flat(obs_t),
            "action": flat(torch.stack(actions)),
            "logp": flat(logps),
            "value": flat(values),
            "advantage": flat(advantages),
            "ret": flat(returns),
        }

    def _count(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.running += reward
        self.env_steps += self.envs
        for e in np.flatnonzero(done):
            self.finished.append(float(self.running[e]))
            self.running[e] = 0.0
            self.episodes += 1

    def metrics(self) -> dict[str, float]:
        """``env_steps``, ``episodes`` (counts) and the mean ``episode_return`` of the episodes ended since."""
        out: dict[str, float] = {"env_steps": int(self.env_steps), "episodes": int(self.episodes)}
        if self.finished:
            out["episode_return"] = float(np.mean(self.finished))
            self.finished = []
        return out


def ppo_loss(model: ActorCritic, batch: Mapping[str, torch.Tensor], params: Mapping[str, Any]) -> dict[str, Any]:
    """PPO's clipped loss of a minibatch and its named values (advantages normalised per minibatch)."""
    clip = float(params.get("clip", 0.2))
    dist = model.distribution(batch["obs"])
    logp = model.log_prob(dist, batch["action"])
    log_ratio = logp - batch["logp"]
    ratio = log_ratio.exp()
    adv = batch["advantage"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    value_loss = 0.5 * (model.value(batch["obs"]).squeeze(-1) - batch["ret"]).pow(2).mean()
    entropy = model.entropy(dist).mean()
    loss = policy_loss + float(params.get("value_coef", 0.5)) * value_loss
    loss = loss - float(params.get("entropy_coef", 0.0)) * entropy
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's low-variance estimator of KL(old || new)
        clip_fraction = ((ratio - 1).abs() > clip).float().mean()
    return {
        "loss": loss,
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }


def evaluate(model: ActorCritic, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` episodes of the greedy (discrete) or mean (Gaussian) policy, side by side."""
    env = make_vector_env(env_id, episodes)
    _, _, _, bounds = env_spaces(env_id)
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while running.any():
            action = model.greedy(torch.as_tensor(np.asarray(obs, dtype=np.float32))).numpy()
            if bounds is not None:
                action = np.clip(action, *bounds)
            obs, reward, terminated, truncated, _ = env.step(action)
            returns += reward * running
            running &= ~np.logical_or(terminated, truncated)
    env.close()
    return float(returns.mean())
