"""A distributed GFlowNet on HyperGrid: the three roles gflowdist runs.

    gflowdist run examples/hypergrid/config.yaml            # 4 ranks: 2 trainers, 1 buffer, 1 coordinator
    gflowdist run examples/hypergrid/config.yaml run.steps=2000 params.height=16
    gflowdist run examples/hypergrid/config.yaml layout.trainers=1 layout.actors=2 -n 5   # with actors

Trainers sample trajectories with their policy, send them to their buffer,
and learn by trajectory balance on fresh + replayed trajectories, averaging
gradients with each other. The buffer scores trajectories by reward plus a
bonus for terminal states it has never seen, and tracks discovered modes;
the coordinator adds up the modes all buffers found.

A slow reward (simulated: gflowdist.simulation.RewardOracle) is set in
``params``: ``oracle_latency_s`` per call, ``oracle_item_s`` and
``oracle_item_cpu_s`` per trajectory; every sampled batch is then scored by
one call. With actors, ``params.trainer_samples: false`` makes the trainers
pure learners (``rollout`` returns None; they learn from
``replay.learner_batch`` replayed trajectories), so only the actors wait
on the oracle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from gflowdist.runtime import Actor, BufferManager, Coordinator, Trainer
from gflowdist.simulation import RewardOracle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hypergrid_gfn import (
    HyperGrid,
    HyperGridPolicy,
    l1_distance,
    modes_mask,
    sample_trajectories,
    state_index,
    tb_residuals,
    weighted_square_mean,
)


def make_env(params) -> HyperGrid:
    return HyperGrid(ndim=int(params.get("ndim", 2)), height=int(params.get("height", 8)))


def sample_scored(model, env, n, generator, epsilon, oracle: RewardOracle) -> dict[str, torch.Tensor]:
    """``n`` trajectories; their log-rewards from ``oracle`` (one call per batch) when it is slow."""
    with torch.no_grad():
        batch = sample_trajectories(model, env, n, generator, epsilon)
    if oracle.slow:
        batch["log_rewards"] = oracle(batch["terminal"]).float()
    return batch


class RecentTerminals:
    """A ring of the last ``window`` sampled terminal states; :meth:`l1` against R/Z."""

    def __init__(self, env: HyperGrid, window: int, device: torch.device | str = "cpu"):
        self.env = env
        self.states = torch.full((window,), -1, dtype=torch.int64, device=device)  # where the batches are made
        self.cursor = 0

    def add(self, terminal: torch.Tensor) -> None:
        slots = (self.cursor + torch.arange(terminal.shape[0], device=self.states.device)) % self.states.numel()
        self.states[slots] = state_index(terminal, self.env).to(self.states.device)
        self.cursor += terminal.shape[0]

    def l1(self) -> float:
        seen = self.states[self.states >= 0]
        return float(l1_distance(torch.bincount(seen, minlength=self.env.n_states).double().cpu(), self.env))


class HyperGridTrainer(Trainer):
    def setup(self):
        p = self.params
        self.env = make_env(p)
        self.model = HyperGridPolicy(self.env, hidden=int(p.get("hidden", 64)), n_layers=int(p.get("layers", 2)))
        self.model.to(self.device)  # the trainer samples and learns on its device; before the optimizer is made
        others = [w for name, w in self.model.named_parameters() if name != "log_z"]
        self.optimizer = torch.optim.Adam(
            [
                {"params": others, "lr": float(p.get("lr", 1e-3))},
                {"params": [self.model.log_z], "lr": float(p.get("lr_logz", 0.1))},
            ]
        )
        self.n = int(p.get("trajectories_per_step", 16))
        self.epsilon = float(p.get("epsilon", 0.0))
        self.oracle = RewardOracle.from_params(self.env.log_reward, p)
        self.samples = bool(p.get("trainer_samples", True))
        self.recent = RecentTerminals(self.env, int(p.get("l1_window", 2000)), self.device)

    def rollout(self, policy_version):
        if not self.samples:
            return None  # a pure learner: the actors sample
        batch = sample_scored(self.model, self.env, self.n, self.generator, self.epsilon, self.oracle)
        self.recent.add(batch["terminal"])
        return batch

    def loss(self, batch):  # trajectory balance; weighted by batch["weights"] from a prioritized buffer
        residuals = tb_residuals(self.model, self.env, batch)
        self.residuals = residuals.detach()
        return weighted_square_mean(residuals, batch.get("weights"))

    def priorities(self, batch):
        """With ``replay.sampler: prioritized``: each replayed trajectory's |TB residual| in this step's loss."""
        return self.residuals.abs() if "keys" in batch else None

    def metrics(self):
        out = {"log_z": float(self.model.log_z.detach())}
        if self.samples:
            out["l1"] = self.recent.l1()
        return out


class HyperGridActor(Actor):
    """Samples with the weights its trainer last sent; never learns."""

    def setup(self):
        p = self.params
        self.env = make_env(p)
        self.model = HyperGridPolicy(self.env, hidden=int(p.get("hidden", 64)), n_layers=int(p.get("layers", 2)))
        self.n = int(p.get("trajectories_per_step", 16))
        self.epsilon = float(p.get("epsilon", 0.0))
        self.oracle = RewardOracle.from_params(self.env.log_reward, p)
        self.recent = RecentTerminals(self.env, int(p.get("l1_window", 2000)), self.device)

    def rollout(self, policy_version):
        batch = sample_scored(self.model, self.env, self.n, self.generator, self.epsilon, self.oracle)
        self.recent.add(batch["terminal"])
        return batch

    def metrics(self):
        """``l1``: over my last ``params.l1_window`` sampled terminal states (as a trainer's)."""
        return {"l1": self.recent.l1()}


class HyperGridBuffer(BufferManager):
    def setup(self):
        self.env = make_env(self.params)
        self.visited = torch.zeros(self.env.n_states, dtype=torch.bool)
        self.is_mode = modes_mask(self.env)
        self.novelty_bonus = float(self.params.get("novelty_bonus", 1.0))

    def score(self, batch):
        fresh = ~self.visited[state_index(batch["terminal"], self.env)]
        return batch["log_rewards"].float() + self.novelty_bonus * fresh.float()

    def on_admitted(self, batch):
        self.visited[state_index(batch["terminal"], self.env)] = True

    def summary(self):
        return {
            "modes": torch.nonzero(self.visited & self.is_mode).flatten().tolist(),
            "visited": int(self.visited.sum()),
        }


class HyperGridCoordinator(Coordinator):
    def setup(self):
        self.total_modes = int(modes_mask(make_env(self.params)).sum())
        self.modes: set[int] = set()

    def on_summary(self, rank, summary):
        self.modes.update(summary.get("modes", []))

    def progress_fields(self):
        return {"modes": f"{len(self.modes)}/{self.total_modes}"}

    def summary(self):
        return {"modes_found": len(self.modes), "modes_total": self.total_modes}
