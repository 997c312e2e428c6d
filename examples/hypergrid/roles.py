"""A distributed GFlowNet on HyperGrid: the three roles gflowdist runs.

    gflowdist run examples/hypergrid/config.yaml            # 4 ranks: 2 trainers, 1 buffer, 1 coordinator
    gflowdist run examples/hypergrid/config.yaml run.steps=2000 params.height=16
    gflowdist run examples/hypergrid/config.yaml layout.trainers=1 layout.actors=2 -n 5   # with actors

Trainers sample trajectories with their policy, send them to their buffer,
and learn by trajectory balance on fresh + replayed trajectories, averaging
gradients with each other. The buffer scores trajectories by reward plus a
bonus for terminal states it has never seen, and tracks discovered modes;
the coordinator adds up the modes all buffers found.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from gflowdist.runtime import Actor, BufferManager, Coordinator, Trainer

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


class HyperGridTrainer(Trainer):
    def setup(self):
        p = self.params
        self.env = make_env(p)
        self.model = HyperGridPolicy(self.env, hidden=int(p.get("hidden", 64)), n_layers=int(p.get("layers", 2)))
        others = [w for name, w in self.model.named_parameters() if name != "log_z"]
        self.optimizer = torch.optim.Adam(
            [
                {"params": others, "lr": float(p.get("lr", 1e-3))},
                {"params": [self.model.log_z], "lr": float(p.get("lr_logz", 0.1))},
            ]
        )
        self.n = int(p.get("trajectories_per_step", 16))
        self.epsilon = float(p.get("epsilon", 0.0))
        window = int(p.get("l1_window", 2000))
        self.recent = torch.full((window,), -1, dtype=torch.int64)  # ring of recent terminal states
        self.cursor = 0

    def rollout(self, policy_version):
        with torch.no_grad():
            batch = sample_trajectories(self.model, self.env, self.n, self.generator, self.epsilon)
        slots = (self.cursor + torch.arange(self.n)) % self.recent.numel()
        self.recent[slots] = state_index(batch["terminal"], self.env)
        self.cursor += self.n
        return batch

    def loss(self, batch):  # trajectory balance; weighted by batch["weights"] from a prioritized buffer
        residuals = tb_residuals(self.model, self.env, batch)
        self.residuals = residuals.detach()
        return weighted_square_mean(residuals, batch.get("weights"))

    def priorities(self, batch):
        """With ``replay.sampler: prioritized``: each replayed trajectory's |TB residual| in this step's loss."""
        return self.residuals.abs() if "keys" in batch else None

    def metrics(self):
        seen = self.recent[self.recent >= 0]
        counts = torch.bincount(seen, minlength=self.env.n_states).double()
        return {"l1": float(l1_distance(counts, self.env)), "log_z": float(self.model.log_z.detach())}


class HyperGridActor(Actor):
    """Samples with the weights its trainer last sent; never learns."""

    def setup(self):
        p = self.params
        self.env = make_env(p)
        self.model = HyperGridPolicy(self.env, hidden=int(p.get("hidden", 64)), n_layers=int(p.get("layers", 2)))
        self.n = int(p.get("trajectories_per_step", 16))
        self.epsilon = float(p.get("epsilon", 0.0))

    def rollout(self, policy_version):
        with torch.no_grad():
            return sample_trajectories(self.model, self.env, self.n, self.generator, self.epsilon)


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
