"""Ape-X-style DQN on CartPole-v1 as gflowdist roles (config.yaml: 2 actors, 1 buffer, 1 learner).

    gflowdist run examples/apex_cartpole/config.yaml

- ``ApexActor`` (dqn.DQNActor): steps ``params.envs_per_actor`` CartPoles with
  its rungs of the Ape-X epsilon ladder, sends n-step transitions with their
  |TD error| as initial priorities, takes weights from the learner.
- ``ApexLearner``: a pure learner (``rollout`` returns None); double DQN on
  prioritized replay batches (``batch["weights"]``), returns |TD error| as new
  priorities (``batch["keys"]`` carries them back to the buffer).
- the buffer is gflowdist's default BufferManager with ``replay.sampler: prioritized``.
- ``ApexCoordinator``: evaluates the greedy policy on the weights the learner
  sends every ``sync.weights_to_coordinator_every`` steps and ends the run at
  ``params.target_return``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dqn import DQNActor, DQNLearner, evaluate, q_network

from gflowdist.rl import make_vector_env
from gflowdist.runtime import Coordinator, Trainer

__all__ = ["ApexActor", "ApexLearner", "ApexCoordinator"]


def env_spaces(env_id: str) -> tuple[int, int]:
    """(observation size, number of actions) of ``env_id``."""
    env = make_vector_env(env_id, 1)
    spaces = int(env.single_observation_space.shape[0]), int(env.single_action_space.n)
    env.close()
    return spaces


class ApexActor(DQNActor):
    """dqn.DQNActor as it is: epsilon-greedy, n-step transitions, |TD| initial priorities."""


class ApexLearner(Trainer):
    """Learns from replay only; hands |TD error| back as priorities."""

    def setup(self):
        self.core = DQNLearner(self.params, *env_spaces(str(self.params["env_id"])))
        self.core.model.to(self.device)  # in place: the optimizer keeps the same parameters
        self.core.target.to(self.device)
        self.model, self.optimizer = self.core.model, self.core.optimizer
        self.td = None
        self.last_loss = float("nan")

    def rollout(self, policy_version):
        return None  # Ape-X: the actors act, the learner only learns

    def loss(self, batch):
        loss, self.td = self.core.loss(batch)
        return loss

    def priorities(self, batch):
        return self.td


class ApexCoordinator(Coordinator):
    """Greedy evaluation of the learner's weights; stops the run at the target return."""

    def setup(self):
        self.net = q_network(self.params, *env_spaces(str(self.params["env_id"])))
        self.episodes = int(self.params.get("eval_episodes", 10))
        self.target = float(self.params.get("target_return", 475.0))
        self.started: float | None = None  # the first loop pass, after every rank's setup
        self.curve: list[dict[str, float]] = []
        self.env_steps: dict[int, float] = {}
        self.episode_return: dict[int, float] = {}

    def on_metrics(self, rank, step, metrics):
        if "env_steps" in metrics:  # an actor's row
            self.env_steps[rank] = float(metrics["env_steps"])
            if "episode_return" in metrics:
                self.episode_return[rank] = float(metrics["episode_return"])

    def on_weights(self, rank, state, version):
        self.net.load_state_dict(state)
        score = evaluate(self.net, str(self.params["env_id"]), self.episodes, seed=10_000 + version)
        started = self.started if self.started is not None else time.monotonic()
        self.curve.append(
            {
                "seconds": round(time.monotonic() - started, 2),
                "learner_steps": version,
                "env_steps": sum(self.env_steps.values()),
                "eval_return": score,
            }
        )
        self.record(version, {"eval_return": score})  # metrics.jsonl, the report's curves, TensorBoard

    def progress_fields(self):
        if not self.curve:
            return {}
        return {
            "eval_return": f"{self.curve[-1]['eval_return']:.1f}",
            "env_steps": f"{self.curve[-1]['env_steps']:.0f}",
        }

    def should_stop(self):
        if self.started is None:  # called on every pass of the coordinator's loop, the first right after setup
            self.started = time.monotonic()
        if self.curve and self.curve[-1]["eval_return"] >= self.target:
            return f"eval_return {self.curve[-1]['eval_return']:g} >= {self.target:g}"  # the run's last line says it
        return False

    def summary(self):
        solved = [point for point in self.curve if point["eval_return"] >= self.target]
        return {"curve": self.curve, "solved": bool(solved), "solved_at": solved[0] if solved else None}
