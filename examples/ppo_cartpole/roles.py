"""DD-PPO as gflowdist roles: trainers that roll out themselves and average gradients, a coordinator.

    gflowdist run examples/ppo_cartpole/config.yaml     # CartPole-v1, discrete actions
    gflowdist run examples/ppo_pendulum/config.yaml     # Pendulum-v1, a Gaussian policy

- ``PPOTrainer``: ``rollout`` steps ``params.envs`` environment copies
  ``params.unroll`` times with its current policy and computes GAE (ppo.Rollouts);
  ``loss`` is PPO's clipped loss of one minibatch, returned with its named values.
  The runtime does the rest from the config: ``learner.epochs`` x
  ``learner.minibatches`` optimizer steps per rollout, each minibatch's gradients
  averaged over the trainers (``sync.mode: gradients``), clipping to
  ``learner.max_grad_norm``, the learning-rate schedule (``self.scheduler``).
- ``PPOCoordinator``: evaluates the greedy (or mean) policy on the weights the first
  trainer sends every ``sync.weights_to_coordinator_every`` steps, records
  ``eval_return`` in metrics.jsonl and ends the run at ``params.target_return``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ppo import Rollouts, evaluate, make_model, make_optimizer, ppo_loss

from gflowdist.layout import Role as LayoutRole
from gflowdist.runtime import Coordinator, Trainer

__all__ = ["PPOTrainer", "PPOCoordinator"]


class PPOTrainer(Trainer):
    """Rolls out ``params.envs`` copies for ``params.unroll`` steps; learns PPO's clipped loss."""

    def setup(self):
        self.model = make_model(self.params)  # the agent group starts from the first trainer's weights
        self.optimizer, self.scheduler = make_optimizer(self.model, self.params, self.config.run.steps)
        seed = int(self.config.run.seed) * 1000 + self.trainer_index() * int(self.params.get("envs", 8))
        self.rollouts = Rollouts(self.params, int(self.params.get("envs", 8)), seed, self.generator)

    def trainer_index(self) -> int:
        layout = getattr(self.context, "layout", None)
        return layout.ranks_of(LayoutRole.TRAINER).index(self.rank) if layout is not None else 0

    def rollout(self, policy_version):
        return self.rollouts.collect(self.model)

    def loss(self, batch):
        return ppo_loss(self.model, batch, self.params)

    def metrics(self):
        return self.rollouts.metrics()


class PPOCoordinator(Coordinator):
    """Evaluates the weights it is sent; stops the run at ``params.target_return``."""

    def setup(self):
        self.net = make_model(self.params)
        self.env_id = str(self.params["env_id"])
        self.episodes = int(self.params.get("eval_episodes", 10))
        self.target = float(self.params["target_return"])
        trainers = len(self.context.layout.ranks_of(LayoutRole.TRAINER)) if self.context is not None else 1
        #: environment steps of all trainers per update: each trainer's rollout is envs x unroll
        self.steps_per_update = trainers * int(self.params.get("envs", 8)) * int(self.params.get("unroll", 128))
        self.started: float | None = None
        self.curve: list[dict[str, float]] = []

    def on_weights(self, rank, state, version):
        self.net.load_state_dict(state)
        score = evaluate(self.net, self.env_id, self.episodes, seed=10_000 + version)
        started = self.started if self.started is not None else time.monotonic()
        self.curve.append(
            {
                "seconds": round(time.monotonic() - started, 2),
                "updates": version,
                "env_steps": version * self.steps_per_update,
                "eval_return": score,
            }
        )
        self.record(version, {"eval_return": score})

    def progress_fields(self):
        return {"eval_return": f"{self.curve[-1]['eval_return']:.1f}"} if self.curve else {}

    def should_stop(self):
        if self.started is None:  # the coordinator's first pass, right after every rank's setup
            self.started = time.monotonic()
        return bool(self.curve) and self.curve[-1]["eval_return"] >= self.target

    def summary(self):
        solved = [point for point in self.curve if point["eval_return"] >= self.target]
        return {"curve": self.curve, "solved": bool(solved), "solved_at": solved[0] if solved else None}
