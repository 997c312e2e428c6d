"""IMPALA on CartPole-v1 as gflowdist roles (config.yaml: 2 unroll actors, 1 queue, 1 learner, 1 coordinator).

    gflowdist run examples/impala_cartpole/config.yaml

- ``ImpalaActor`` (a :class:`gflowdist.rl.UnrollActor`): steps
  ``params.envs_per_actor`` CartPoles, samples from its copy of the policy and
  sends unrolls of ``params.unroll_length`` steps with the log-probabilities
  of the actions it took; holds back while the queue is full.
- the buffer is gflowdist's default BufferManager with ``replay.sampler: queue``:
  each unroll is served once, oldest first; unrolls whose policy lag exceeds
  ``replay.max_staleness`` are dropped (the ledger's ``stale``).
- ``ImpalaLearner``: a pure learner (``rollout`` returns None) on
  ``replay.learner_batch`` unrolls per step, V-trace corrected (impala.py).
- ``ImpalaCoordinator``: evaluates the greedy policy on the weights the learner
  sends every ``sync.weights_to_coordinator_every`` steps and ends the run at
  ``params.target_return``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from impala import actor_critic, evaluate, impala_loss

from gflowdist.rl import UnrollActor, categorical_actions
from gflowdist.runtime import Coordinator, Trainer

__all__ = ["ImpalaActor", "ImpalaLearner", "ImpalaCoordinator"]


class ImpalaActor(UnrollActor):
    """Samples actions from its copy of the learner's policy."""

    def setup(self):
        super().setup()
        self.model = actor_critic(self.params)

    def act(self, obs):
        with torch.no_grad():
            logits, _ = self.model(obs)
        return categorical_actions(logits, self.generator)


class ImpalaLearner(Trainer):
    """Learns from the queue only, with V-trace targets."""

    def setup(self):
        self.model = actor_critic(self.params)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=float(self.params.get("lr", 1e-3)))
        self.last: dict[str, float] = {}

    def rollout(self, policy_version):
        return None  # IMPALA: the actors act, the learner only learns

    def loss(self, batch):
        loss, self.last = impala_loss(self.model, batch, self.params)
        return loss

    def metrics(self):
        return dict(self.last)


class ImpalaCoordinator(Coordinator):
    """Greedy evaluation of the learner's weights; stops the run at the target return."""

    def setup(self):
        self.net = actor_critic(self.params)
        self.episodes = int(self.params.get("eval_episodes", 10))
        self.target = float(self.params.get("target_return", 475.0))
        self.started: float | None = None
        self.curve: list[dict[str, float]] = []
        self.env_steps: dict[int, float] = {}
        #: environment steps in one learner batch: learner_batch unrolls of unroll_length steps
        self.steps_per_update = int(self.config.replay.learner_batch) * int(self.params.get("unroll_length", 20))

    def on_metrics(self, rank, step, metrics):
        if "env_steps" in metrics:  # an actor's row
            self.env_steps[rank] = float(metrics["env_steps"])

    def on_weights(self, rank, state, version):
        self.net.load_state_dict(state)
        score = evaluate(self.net, str(self.params["env_id"]), self.episodes, seed=10_000 + version)
        started = self.started if self.started is not None else time.monotonic()
        self.curve.append(
            {
                "seconds": round(time.monotonic() - started, 2),
                "learner_steps": version,
                "env_steps": version * self.steps_per_update,  # learned from: exact, as the single process counts
                "env_steps_reported": sum(self.env_steps.values()),  # the actors' last reports (more: queued, stale)
                "eval_return": score,
            }
        )
        self.record(version, {"eval_return": score})

    def progress_fields(self):
        if not self.curve:
            return {}
        return {
            "eval_return": f"{self.curve[-1]['eval_return']:.1f}",
            "env_steps": f"{self.curve[-1]['env_steps']:.0f}",
        }

    def should_stop(self):
        if self.started is None:
            self.started = time.monotonic()
        return bool(self.curve) and self.curve[-1]["eval_return"] >= self.target

    def summary(self):
        solved = [point for point in self.curve if point["eval_return"] >= self.target]
        return {"curve": self.curve, "solved": bool(solved), "solved_at": solved[0] if solved else None}
