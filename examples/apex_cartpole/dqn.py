"""DQN pieces shared by the Ape-X run (roles.py) and the single-process baseline (single_process.py).

Double DQN on n-step transitions (:mod:`gflowdist.rl.transitions`) with
prioritized replay and a target network. For a replayed batch of
transitions with importance weights ``w``::

    a*     = argmax_a Q_online(next_obs, a)                       (double DQN: select online,
    target = reward + discount * (1 - terminated) * Q_target(next_obs, a*)    evaluate target)
    td     = Q_online(obs, action) - target
    loss   = mean(w * huber(td))          new priority = |td|

The actor computes the same |td| with its own copy of the online network
for both selection and evaluation (it holds no target network) as the
initial priority of each transition it sends (Ape-X).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from torch import nn

from gflowdist.rl import EnvironmentActor, epsilon_greedy, make_vector_env

__all__ = ["QNetwork", "DQNActor", "DQNLearner", "td_errors", "evaluate"]


class QNetwork(nn.Module):
    """obs -> Q(obs, .) with ``layers`` hidden ReLU layers of ``hidden`` units (default two)."""

    def __init__(self, obs_dim: int, actions: int, hidden: int, layers: int = 2):
        super().__init__()
        widths = [obs_dim] + [hidden] * layers
        body = [m for a, b in pairwise(widths) for m in (nn.Linear(a, b), nn.ReLU())]
        self.net = nn.Sequential(*body, nn.Linear(widths[-1], actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def td_errors(online: nn.Module, target: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``Q_online(obs, action) - n-step double-DQN target`` (gradient through the first term only)."""
    q = online(batch["obs"]).gather(1, batch["action"].view(-1, 1)).squeeze(1)
    with torch.no_grad():
        best = online(batch["next_obs"]).argmax(1, keepdim=True)
        bootstrap = target(batch["next_obs"]).gather(1, best).squeeze(1)
        alive = 1.0 - batch["terminated"].float()
        goal = batch["reward"] + batch["discount"] * alive * bootstrap
    return q - goal


def q_network(params: Mapping[str, Any], obs_dim: int, actions: int) -> QNetwork:
    return QNetwork(obs_dim, actions, int(params.get("hidden", 128)), int(params.get("layers", 2)))


class DQNActor(EnvironmentActor):
    """Epsilon-greedy on its copy of the online network; sends |td| as initial priorities."""

    def setup(self):
        super().setup()
        self.model = q_network(self.params, self.obs_shape[0], self.num_actions)

    def act(self, obs, epsilon):
        with torch.no_grad():
            return epsilon_greedy(self.model(obs), epsilon, self.generator)

    def initial_priorities(self, batch):
        with torch.no_grad():
            return td_errors(self.model, self.model, batch).abs()


class DQNLearner:
    """The learner's state and step, independent of how batches arrive.

    ``update(batch)`` takes a replayed batch (with ``weights``), does one
    optimizer step and returns ``(loss, |td|)``; the target network is copied
    from the online one every ``params.target_update`` steps.
    """

    def __init__(self, params: Mapping[str, Any], obs_dim: int, actions: int):
        self.model = q_network(params, obs_dim, actions)
        self.target = q_network(params, obs_dim, actions)
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=float(params.get("lr", 1e-3)))
        self.target_update = int(params.get("target_update", 200))
        self.updates = 0

    def loss(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weighted Huber loss, |td| detached)`` of ``batch``; called once per optimizer step,
        it first copies the online network into the target every ``target_update`` calls."""
        if self.updates % self.target_update == 0:
            self.target.load_state_dict(self.model.state_dict())
        self.updates += 1
        td = td_errors(self.model, self.target, batch)
        weights = batch.get("weights")
        huber = nn.functional.huber_loss(td, torch.zeros_like(td), reduction="none")
        loss = (huber * weights).mean() if weights is not None else huber.mean()
        return loss, td.detach().abs()

    def update(self, batch: Mapping[str, torch.Tensor]) -> tuple[float, torch.Tensor]:
        """One optimizer step on ``batch`` (what the runtime's trainer step does); ``(loss, |td|)``."""
        loss, priorities = self.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach()), priorities


def evaluate(model: nn.Module, env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` greedy episodes, run side by side in one vector environment."""
    env = make_vector_env(env_id, episodes)
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while running.any():
            actions = model(torch.from_numpy(np.asarray(obs, dtype=np.float32))).argmax(1).numpy()
            obs, reward, terminated, truncated, _ = env.step(actions)
            returns += reward * running
            running &= ~np.logical_or(terminated, truncated)
    env.close()
    return float(returns.mean())
