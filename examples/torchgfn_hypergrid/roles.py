"""torchgfn's own HyperGrid GFlowNet, trained as a gflowdist job (needs ``torchgfn``).

    pip install 'torchgfn==2.4.1'
    gflowdist run examples/torchgfn_hypergrid/config.yaml     # 4 ranks: 2 trainers, 1 buffer, 1 coordinator
    gflowdist run examples/torchgfn_hypergrid/config.yaml run.steps=100 params.epsilon=0.1

Everything that models, samples and scores is torchgfn's, built as in its
``tutorials/examples/train_hypergrid_simple.py``: the environment
``gfn.gym.HyperGrid``, a ``KHotPreprocessor``, two ``MLP`` s sharing a trunk
inside ``DiscretePolicyEstimator`` s, a ``TBGFlowNet`` and a ``Sampler``.
gflowdist supplies the loop around them:

* ``setup``   builds the env, the ``TBGFlowNet`` (``self.model``; its
  parameters are what the trainers average, initialised from ``run.seed`` so
  every trainer starts from the same weights) and Adam with torchgfn's two
  learning rates (``pf_pb_parameters`` and ``logz_parameters``);
* ``rollout`` samples with torchgfn's ``Sampler`` and turns the
  ``Trajectories`` into plain tensors (``trajectory_wire.trajectories_to_batch``),
  which is what crosses the wire to the buffer;
* ``loss``    rebuilds a ``Trajectories`` from fresh + replayed tensors and
  returns torchgfn's own ``gflownet.loss(env, trajectories)`` (trajectory
  balance, log-probabilities recomputed with the current model).

The buffer scores a trajectory by ``log R(x) + novelty_bonus * [x never
admitted before]`` and records the distinct terminal states and modes it has
admitted (torchgfn's ``modes_found``); the coordinator unions the modes of
every buffer. Sampling uses torch's global RNG, which gflowdist seeds per
rank from ``run.seed``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.runtime import BufferManager, Coordinator, Trainer

try:
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gflownet import TBGFlowNet
    from gfn.gym import HyperGrid
    from gfn.preprocessors import KHotPreprocessor
    from gfn.samplers import Sampler
    from gfn.states import DiscreteStates
    from gfn.utils.modules import MLP, DiscreteUniform
except ModuleNotFoundError as err:
    raise GflowdistError(
        f"examples/torchgfn_hypergrid needs torchgfn ({err}); install it with pip install 'torchgfn==2.4.1'"
    ) from err

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trajectory_wire import batch_to_trajectories, trajectories_to_batch


def make_env(params: Mapping[str, Any]) -> HyperGrid:
    """torchgfn's HyperGrid with the original reward (R0=0.1, R1=0.5, R2=2).

    Built without ``store_all_states``: torchgfn enumerates the states in a
    ``multiprocessing.Pool`` (forked workers, the env pickled to them), which
    has no place inside an MPI rank; :func:`all_states` does it in place.
    """
    ndim, height = int(params.get("ndim", 2)), int(params.get("height", 8))
    try:
        return HyperGrid(ndim=ndim, height=height)
    except ValueError as err:  # torchgfn refuses grids whose reward has no mode
        raise ConfigError(
            f"torchgfn rejects HyperGrid(ndim={ndim}, height={height}): {err}", key="params.height"
        ) from err


def all_states(env: HyperGrid) -> DiscreteStates:
    """The ``H**D`` states in torchgfn's canonical order: row ``i`` has
    ``env.get_states_indices(row) == i``, ``x_d = (i // H**(D-1-d)) % H``."""
    strides = env.height ** torch.arange(env.ndim - 1, -1, -1)
    flat = torch.arange(env.n_states).unsqueeze(-1)
    return env.states_from_tensor(torch.div(flat, strides, rounding_mode="floor") % env.height)


def true_distribution(env: HyperGrid) -> torch.Tensor:
    """float64 ``[H**D]``: ``R(x) / Z`` in canonical order (torchgfn's ``env.true_dist()``)."""
    rewards = env.reward(all_states(env)).double()
    return rewards / rewards.sum()


def max_length(env: HyperGrid) -> int:
    """``D*(H-1) + 1``: the longest trajectory walks to the far corner, then exits."""
    return env.ndim * (env.height - 1) + 1


def make_gflownet(env: HyperGrid, params: Mapping[str, Any]) -> TBGFlowNet:
    """``P_F`` and ``P_B`` MLPs over the k-hot state, sharing a trunk, and a learned ``logZ``."""
    preprocessor = KHotPreprocessor(height=env.height, ndim=env.ndim)
    hidden, layers = int(params.get("hidden", 64)), int(params.get("layers", 2))
    module_pf = MLP(
        input_dim=preprocessor.output_dim, output_dim=env.n_actions, hidden_dim=hidden, n_hidden_layers=layers
    )
    if params.get("uniform_pb", False):
        module_pb = DiscreteUniform(output_dim=env.n_actions - 1)
    else:
        module_pb = MLP(
            input_dim=preprocessor.output_dim,
            output_dim=env.n_actions - 1,
            hidden_dim=hidden,
            n_hidden_layers=layers,
            trunk=module_pf.trunk,
        )
    pf = DiscretePolicyEstimator(module_pf, env.n_actions, preprocessor=preprocessor, is_backward=False)
    pb = DiscretePolicyEstimator(module_pb, env.n_actions, preprocessor=preprocessor, is_backward=True)
    return TBGFlowNet(pf=pf, pb=pb, init_logZ=0.0)


class TorchgfnHyperGridTrainer(Trainer):
    def setup(self) -> None:
        p = self.params
        self.env = make_env(p)
        self.max_length = max_length(self.env)
        # Every trainer builds the same initial weights (from run.seed, not the rank's seed):
        # averaged gradients keep data-parallel replicas equal only if they start equal.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.run.seed)
            self.model = make_gflownet(self.env, p)
        self.sampler = Sampler(estimator=self.model.pf)
        self.optimizer = torch.optim.Adam(self.model.pf_pb_parameters(), lr=float(p.get("lr", 1e-3)))
        self.optimizer.add_param_group({"params": self.model.logz_parameters(), "lr": float(p.get("lr_logz", 0.1))})
        self.n = int(p.get("trajectories_per_step", 16))
        self.epsilon = float(p.get("epsilon", 0.0))
        self.true_dist = true_distribution(self.env)
        window = int(p.get("l1_window", 2000))
        self.recent = torch.full((window,), -1, dtype=torch.int64)  # ring of recent terminal states
        self.cursor = 0

    def rollout(self, policy_version: int) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            trajectories = self.sampler.sample_trajectories(self.env, n=self.n, epsilon=self.epsilon)
        batch = trajectories_to_batch(trajectories, self.max_length)
        slots = (self.cursor + torch.arange(self.n)) % self.recent.numel()
        self.recent[slots] = self.env.get_states_indices(batch["terminal"])
        self.cursor += self.n
        return batch

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.loss(self.env, batch_to_trajectories(self.env, batch))

    def metrics(self) -> dict[str, float]:
        """``l1_dist``: torchgfn's definition, ``mean_x |p_emp(x) - p_true(x)|`` over the window."""
        seen = self.recent[self.recent >= 0]
        counts = torch.bincount(seen, minlength=self.env.n_states).double()
        l1_dist = (counts / counts.sum() - self.true_dist).abs().mean()
        return {"l1_dist": float(l1_dist), "log_z": float(self.model.logZ.detach())}


class TorchgfnHyperGridBuffer(BufferManager):
    def setup(self) -> None:
        self.env = make_env(self.params)
        self.visited = torch.zeros(self.env.n_states, dtype=torch.bool)
        self.modes: set[int] = set()
        self.novelty_bonus = float(self.params.get("novelty_bonus", 1.0))

    def score(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        fresh = ~self.visited[self.env.get_states_indices(batch["terminal"])]
        return batch["log_rewards"].float() + self.novelty_bonus * fresh.float()

    def on_admitted(self, batch: dict[str, torch.Tensor]) -> None:
        self.visited[self.env.get_states_indices(batch["terminal"])] = True
        self.modes |= self.env.modes_found(self.env.states_from_tensor(batch["terminal"]))

    def summary(self) -> dict[str, Any]:
        return {"modes": sorted(self.modes), "visited": int(self.visited.sum())}


class TorchgfnHyperGridCoordinator(Coordinator):
    def setup(self) -> None:
        env = make_env(self.params)
        self.total_modes = len(env.modes_found(all_states(env)))
        self.modes: set[int] = set()

    def on_summary(self, rank: int, summary: Mapping[str, Any]) -> None:
        self.modes.update(summary.get("modes", []))

    def progress_fields(self) -> dict[str, Any]:
        return {"modes": f"{len(self.modes)}/{self.total_modes}"}

    def summary(self) -> dict[str, Any]:
        return {"modes_found": len(self.modes), "modes_total": self.total_modes}
