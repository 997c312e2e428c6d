"""IMPALA pieces for CartPole: an actor-critic network, the V-trace loss, the greedy evaluation.

The learner's loss on a batch of ``B`` unrolls of ``T`` steps (fields of
:mod:`gflowdist.rl.unrolls`), with ``pi`` the learner's policy and ``V`` its value head::

    vs, advantages = vtrace(behaviour_log_prob, log pi(a_t|x_t), reward, V(x_t), V(bootstrap_obs), terminated,
                            truncated=truncated, truncation_values=V(final_obs))    (gflowdist.rl.returns)
    loss = -mean(advantages * log pi(a_t|x_t))                            policy gradient
           + value_coef * 0.5 * mean((vs - V(x_t))^2)                     value regression
           - entropy_coef * mean(entropy of pi(.|x_t))                    exploration
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from gflowdist.rl import make_vector_env, vtrace

__all__ = ["ActorCritic", "actor_critic", "impala_loss", "evaluate", "env_spaces"]


class ActorCritic(nn.Module):
    """obs -> (logits over actions, value), two hidden tanh layers shared by both heads."""

    def __init__(self, obs_dim: int, actions: int, hidden: int):
        super().__init__()
        self.torso = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.torso(obs)
        return self.policy(h), self.value(h).squeeze(-1)


def env_spaces(env_id: str) -> tuple[int, int]:
    """(observation size, number of actions) of ``env_id``."""
    env = make_vector_env(env_id, 1)
    spaces = int(env.single_observation_space.shape[0]), int(env.single_action_space.n)
    env.close()
    return spaces


def actor_critic(params: Mapping[str, Any]) -> ActorCritic:
    return ActorCritic(*env_spaces(str(params["env_id"])), int(params.get("hidden", 64)))


def impala_loss(
    model: ActorCritic, batch: Mapping[str, torch.Tensor], params: Mapping[str, Any]
) -> tuple[torch.Tensor, dict[str, float]]:
    """``(loss, {policy_loss, value_loss, entropy, mean_rho})`` of a batch of unrolls (module docstring)."""
    obs = batch["obs"]
    B, T = obs.shape[:2]
    logits, values = model(obs.reshape(B * T, -1))
    logits, values = logits.reshape(B, T, -1), values.reshape(B, T)
    with torch.no_grad():
        _, bootstrap = model(batch["bootstrap_obs"])
        _, final = model(batch["final_obs"].reshape(B * T, -1))
    log_probs = torch.log_softmax(logits, dim=-1)
    taken = log_probs.gather(2, batch["action"].unsqueeze(2)).squeeze(2)
    targets = vtrace(  # time-major: the unrolls are batch-first [B, T]
        batch["behaviour_log_prob"].T,
        taken.detach().T,
        batch["reward"].T,
        values.detach().T,
        bootstrap,
        batch["terminated"].T,
        gamma=float(params.get("gamma", 0.99)),
        rho_bar=float(params.get("rho_bar", 1.0)),
        c_bar=float(params.get("c_bar", 1.0)),
        truncated=batch["truncated"].T,
        truncation_values=final.reshape(B, T).T,
    )
    policy_loss = -(targets.advantages.T * taken).mean()
    value_loss = 0.5 * ((targets.vs.T - values) ** 2).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    loss = (
        policy_loss
        + float(params.get("value_coef", 0.5)) * value_loss
        - float(params.get("entropy_coef", 0.01)) * entropy
    )
    return loss, {
        "policy_loss": float(policy_loss.detach()),
        "value_loss": float(value_loss.detach()),
        "entropy": float(entropy.detach()),
        "mean_rho": float(targets.rhos.mean()),
    }


def evaluate(model: ActorCritic, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` greedy episodes (argmax of the logits), run side by side."""
    env = make_vector_env(env_id, episodes)
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while running.any():
            logits, _ = model(torch.from_numpy(np.asarray(obs, dtype=np.float32)))
            obs, reward, terminated, truncated, _ = env.step(logits.argmax(1).numpy())
            returns += reward * running
            running &= ~np.logical_or(terminated, truncated)
    env.close()
    return float(returns.mean())
