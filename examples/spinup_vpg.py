"""Spinning-Up-style VPG on a toy corridor, moved to gflowdist by changing two imports.

What it shows: a Spinning Up training script (vanilla policy gradient with
GAE-lambda advantages, as in ``spinup/algos/pytorch/vpg/vpg.py``) runs on
gflowdist unchanged except for its imports. ``mpi_fork`` re-launches the
script under ``mpiexec``; ``sync_params`` starts every rank from rank 0's
weights; ``mpi_avg_grads`` averages gradients (one flat reduction instead of
one per parameter); ``mpi_statistics_scalar`` pools advantage and return
statistics over ranks, including ranks that finished no episode this epoch.

Run:

    python examples/spinup_vpg.py --cpu 2                 # mpi_fork re-launches under mpiexec -n 2
    mpiexec -n 2 python examples/spinup_vpg.py            # already a job: mpi_fork does nothing
    python examples/spinup_vpg.py --epochs 3 --steps 300  # one process, a few seconds

Before (Spinning Up):

    from spinup.utils.mpi_tools import mpi_fork, mpi_avg, proc_id, mpi_statistics_scalar, num_procs
    from spinup.utils.mpi_pytorch import setup_pytorch_for_mpi, sync_params, mpi_avg_grads

After: the two lines below marked "the only change".
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch
from torch import nn

# the only change: gflowdist.compat.spinup instead of spinup.utils.mpi_tools / mpi_pytorch
from gflowdist.compat.spinup import (
    mpi_avg,
    mpi_avg_grads,
    mpi_fork,
    mpi_statistics_scalar,
    num_procs,
    proc_id,
    setup_pytorch_for_mpi,
    sync_params,
)


@dataclasses.dataclass
class Args:
    cpu: int = 1
    """number of MPI ranks; mpi_fork re-launches the script when > 1"""
    epochs: int = 30
    """training epochs (one policy update each)"""
    steps: int = 1000
    """environment steps per epoch, summed over all ranks"""
    length: int = 6
    """corridor length: the goal is this many cells from the start"""
    max_ep_len: int = 40
    """an episode is cut after this many steps"""
    gamma: float = 0.99
    """discount factor"""
    lam: float = 0.97
    """GAE lambda"""
    pi_lr: float = 3e-3
    """policy learning rate"""
    vf_lr: float = 1e-2
    """value function learning rate"""
    train_v_iters: int = 20
    """value function gradient steps per epoch"""
    seed: int = 0
    """run seed; rank r uses seed + 10000 r (Spinning Up's rule)"""


# -- the environment (change freely) ----------------------------------------------


class Corridor:
    """Cells 0 .. length-1; start at 0; action 1 moves right, 0 left; reward 1 at the last cell, else -0.05."""

    def __init__(self, length: int):
        self.length = length
        self.position = 0

    def reset(self) -> np.ndarray:
        self.position = 0
        return self._observe()

    def step(self, action: int) -> tuple[np.ndarray, float, bool]:
        self.position = int(np.clip(self.position + (1 if action == 1 else -1), 0, self.length - 1))
        done = self.position == self.length - 1
        return self._observe(), (1.0 if done else -0.05), done

    def _observe(self) -> np.ndarray:
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self.position] = 1.0
        return obs


# -- Spinning Up's VPG, condensed ----------------------------------------------------


def discount_cumsum(x: np.ndarray, discount: float) -> np.ndarray:
    """``out[t] = sum_k discount^k x[t + k]``."""
    out = np.zeros_like(x)
    running = 0.0
    for t in range(len(x) - 1, -1, -1):
        running = x[t] + discount * running
        out[t] = running
    return out


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int = 2, hidden: int = 32):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))
        self.v = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.pi(obs))

    def step(self, obs: np.ndarray) -> tuple[int, float, float]:
        with torch.no_grad():
            o = torch.as_tensor(obs)
            dist = self.distribution(o)
            action = dist.sample()
            return int(action), float(self.v(o)), float(dist.log_prob(action))


class VPGBuffer:
    """Trajectories of one epoch on this rank, with GAE-lambda advantages and rewards-to-go."""

    def __init__(self, obs_dim: int, size: int, gamma: float, lam: float):
        self.obs = np.zeros((size, obs_dim), dtype=np.float32)
        self.act = np.zeros(size, dtype=np.int64)
        self.rew = np.zeros(size, dtype=np.float32)
        self.val = np.zeros(size, dtype=np.float32)
        self.adv = np.zeros(size, dtype=np.float32)
        self.ret = np.zeros(size, dtype=np.float32)
        self.gamma, self.lam = gamma, lam
        self.ptr, self.path_start = 0, 0

    def store(self, obs, act, rew, val) -> None:
        self.obs[self.ptr], self.act[self.ptr], self.rew[self.ptr], self.val[self.ptr] = obs, act, rew, val
        self.ptr += 1

    def finish_path(self, last_val: float = 0.0) -> None:
        path = slice(self.path_start, self.ptr)
        rews = np.append(self.rew[path], last_val)
        vals = np.append(self.val[path], last_val)
        deltas = rews[:-1] + self.gamma * vals[1:] - vals[:-1]
        self.adv[path] = discount_cumsum(deltas, self.gamma * self.lam)
        self.ret[path] = discount_cumsum(rews, self.gamma)[:-1]
        self.path_start = self.ptr

    def get(self) -> dict[str, torch.Tensor]:
        self.ptr, self.path_start = 0, 0
        adv_mean, adv_std = mpi_statistics_scalar(self.adv)  # pooled over every rank
        adv = (self.adv - adv_mean) / (adv_std + 1e-8)
        return {
            "obs": torch.as_tensor(self.obs),
            "act": torch.as_tensor(self.act),
            "adv": torch.as_tensor(adv),
            "ret": torch.as_tensor(self.ret),
        }


def train(args: Args) -> ActorCritic:
    setup_pytorch_for_mpi()
    seed = args.seed + 10000 * proc_id()
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = Corridor(args.length)
    ac = ActorCritic(args.length)
    sync_params(ac)  # every rank starts from rank 0's weights
    pi_opt = torch.optim.Adam(ac.pi.parameters(), lr=args.pi_lr)
    v_opt = torch.optim.Adam(ac.v.parameters(), lr=args.vf_lr)
    local_steps = args.steps // num_procs()
    buf = VPGBuffer(args.length, local_steps, args.gamma, args.lam)
    start = time.time()
    for epoch in range(args.epochs):
        obs, ep_ret, ep_len, ep_rets, ep_lens = env.reset(), 0.0, 0, [], []
        for t in range(local_steps):
            action, value, _ = ac.step(obs)
            next_obs, reward, done = env.step(action)
            buf.store(obs, action, reward, value)
            obs, ep_ret, ep_len = next_obs, ep_ret + reward, ep_len + 1
            timeout = ep_len == args.max_ep_len
            if done or timeout or t == local_steps - 1:
                last_value = 0.0 if done else ac.step(obs)[1]
                buf.finish_path(last_value)
                if done or timeout:
                    ep_rets.append(ep_ret)
                    ep_lens.append(ep_len)
                obs, ep_ret, ep_len = env.reset(), 0.0, 0
        data = buf.get()
        pi_opt.zero_grad()
        logp = ac.distribution(data["obs"]).log_prob(data["act"])
        loss_pi = -(logp * data["adv"]).mean()
        loss_pi.backward()
        mpi_avg_grads(ac.pi)  # average gradients over ranks
        pi_opt.step()
        for _ in range(args.train_v_iters):
            v_opt.zero_grad()
            loss_v = ((ac.v(data["obs"]).squeeze(-1) - data["ret"]) ** 2).mean()
            loss_v.backward()
            mpi_avg_grads(ac.v)
            v_opt.step()
        ret_mean, ret_std, ret_min, ret_max = mpi_statistics_scalar(ep_rets, with_min_and_max=True)
        ep_len_mean = mpi_avg(float(np.mean(ep_lens)) if ep_lens else 0.0)
        if proc_id() == 0:
            print(
                f"epoch {epoch:3d}  EpRet {ret_mean:7.3f} +- {ret_std:5.3f} [{ret_min:6.2f}, {ret_max:5.2f}]  "
                f"EpLen {ep_len_mean:5.1f}  LossPi {float(loss_pi.detach()):7.4f}  {time.time() - start:5.1f} s",
                flush=True,
            )
    return ac


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return Args(**vars(parser.parse_args()))


if __name__ == "__main__":
    arguments = parse_args()
    mpi_fork(arguments.cpu)  # the parent runs `mpiexec -n cpu` on this script and exits with its status
    model = train(arguments)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    print(f"FINAL rank {proc_id()} of {num_procs()} params {checksum:.10f}", flush=True)
