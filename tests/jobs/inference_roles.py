"""Small roles for the inference-rank jobs (tests/test_inference_jobs.py): CartPole, a linear Q-function.

``params.shift_rank`` / ``params.shift_after``: that actor's observations gain a column after that many
environment steps (an inference request whose observation shape changes).
"""

from __future__ import annotations

import torch

from gflowdist.config.classes import load_class
from gflowdist.rl import EnvironmentActor
from gflowdist.rl.exploration import epsilon_greedy
from gflowdist.runtime import Trainer

PlainSGD = load_class("toy_roles.py:PlainSGD", key="roles.trainer", file=__file__)  # not torch.optim: see there


class LinearActor(EnvironmentActor):
    def setup(self):
        super().setup()
        self.model = torch.nn.Linear(self.obs_shape[0], self.num_actions)

    def act(self, obs, epsilon):
        with torch.no_grad():
            return epsilon_greedy(self.model(obs), epsilon, self.generator)

    def obs_tensor(self, obs=None):
        base = super().obs_tensor(obs)
        shift_rank, after = self.params.get("shift_rank"), int(self.params.get("shift_after", 0))
        if self.rank == shift_rank and self.env_steps >= after:
            return torch.cat([base, torch.zeros(base.shape[0], 1)], dim=1)
        return base


class LinearLearner(Trainer):
    def setup(self):
        self.model = torch.nn.Linear(4, 2)
        self.optimizer = PlainSGD(self.model.parameters(), lr=1e-3)

    def rollout(self, policy_version):
        return None

    def loss(self, batch):
        q = self.model(batch["obs"]).gather(1, batch["action"].long().view(-1, 1)).squeeze(1)
        return (q - batch["reward"].float()).pow(2).mean()
