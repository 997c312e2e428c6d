"""Bare single-process GFlowNet training on the HyperGrid: no framework, one file.

    python examples/hypergrid/bare.py                  # defaults below, a few seconds
    python examples/hypergrid/bare.py --n-steps 4000 --height 16

Each step samples ``batch_size`` trajectories with the current policy, takes
one Adam step on the trajectory-balance loss, and records the terminal states.
Progress lines report the L1 distance of the last ``window`` sampled terminal
states to the true distribution R/Z (torchgfn's "visited states" validation,
but summed, see hypergrid_gfn.l1_distance) and, on small grids, the exact L1 of the
model's own terminal distribution. ``train(args)`` returns the metrics, so a
benchmark can call it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass

import torch
from hypergrid_gfn import (
    HyperGrid,
    HyperGridPolicy,
    count_modes,
    exact_terminal_distribution,
    l1_distance,
    modes_mask,
    sample_trajectories,
    state_index,
    tb_loss,
    true_distribution,
)


@dataclass
class Args:
    # --- the environment ---
    ndim: int = 2
    """D, the number of coordinates"""
    height: int = 8
    """H, the side of the grid (H = 8 is the smallest with modes for the default reward)"""
    # --- the model ---
    hidden: int = 64
    """width of the P_F / P_B MLPs"""
    n_layers: int = 2
    """hidden layers of each MLP"""
    uniform_pb: bool = False
    """use a fixed uniform backward policy instead of a learned one"""
    # --- training (change these) ---
    n_steps: int = 1000
    """optimizer steps"""
    batch_size: int = 16
    """trajectories sampled per step"""
    lr: float = 1e-3
    """Adam learning rate of the P_F / P_B networks"""
    lr_logz: float = 1e-1
    """Adam learning rate of log Z (torchgfn's lr_Z)"""
    epsilon: float = 0.0
    """probability of a uniform random allowed action while sampling"""
    seed: int = 0
    """seeds the model initialisation and the sampler's generator"""
    # --- a slow reward (simulated, gflowdist.simulation.RewardOracle; one call per batch) ---
    oracle_latency_s: float = 0.0
    """seconds each reward call waits"""
    oracle_item_s: float = 0.0
    """seconds each reward call waits per trajectory"""
    # --- reporting ---
    window: int = 2000
    """L1 is measured over this many most recently sampled terminal states"""
    log_every: int = 100
    """steps between progress lines (0: silent)"""
    exact_max_states: int = 4096
    """also report the exact L1 of the model's P_T when H**D is at most this"""


def _exact_l1(model: HyperGridPolicy, env: HyperGrid) -> float:
    return float((exact_terminal_distribution(model, env) - true_distribution(env)).abs().sum())


def train(args: Args) -> dict:
    """Train from scratch; returns the metrics (all plain Python numbers and lists).

    ``l1_initial`` is measured on ``window`` trajectories of the untrained model,
    ``l1_final`` on the last ``window`` trajectories sampled in training (equal
    sample sizes, so both carry the same sampling noise). ``traj_per_s`` counts
    training trajectories over the training loop's wall time only.
    """
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    env = HyperGrid(ndim=args.ndim, height=args.height)
    model = HyperGridPolicy(env, hidden=args.hidden, n_layers=args.n_layers, uniform_pb=args.uniform_pb)
    others = [p for name, p in model.named_parameters() if name != "log_z"]
    optimizer = torch.optim.Adam([{"params": others, "lr": args.lr}, {"params": [model.log_z], "lr": args.lr_logz}])
    oracle = None
    if args.oracle_latency_s or args.oracle_item_s:  # the simulated slow reward (gflowdist only for this)
        from gflowdist.simulation import RewardOracle

        oracle = RewardOracle(env.log_reward, args.oracle_latency_s, args.oracle_item_s, prefix="oracle_")
    exact = env.n_states <= args.exact_max_states
    n_modes = int(modes_mask(env).sum())
    true_log_z = math.log(float(env.reward(env.all_states()).sum()))

    probe = sample_trajectories(model, env, args.window, generator, epsilon=args.epsilon)
    metrics: dict = {
        "l1_initial": l1_distance(probe["terminal"], env),
        "n_modes": n_modes,
        "true_log_z": true_log_z,
        "history": [],
    }
    if exact:
        metrics["l1_exact_initial"] = _exact_l1(model, env)

    recent = torch.empty(0, dtype=torch.long)  # flat indices of the last `window` terminals
    found: set[int] = set()  # distinct mode states seen so far
    mode_of = modes_mask(env)
    start = time.perf_counter()
    for step in range(1, args.n_steps + 1):
        batch = sample_trajectories(model, env, args.batch_size, generator, args.epsilon)
        if oracle is not None:
            batch["log_rewards"] = oracle(batch["terminal"]).float()
        loss = tb_loss(model, env, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        flat = state_index(batch["terminal"], env)
        recent = torch.cat([recent, flat])[-args.window :]
        found.update(flat[mode_of[flat]].tolist())
        if args.log_every and (step % args.log_every == 0 or step == args.n_steps):
            row = {
                "step": step,
                "loss": loss.item(),
                "log_z": model.log_z.item(),
                "l1": l1_distance(torch.bincount(recent, minlength=env.n_states), env),
                "modes": len(found),
            }
            if exact:
                row["l1_exact"] = _exact_l1(model, env)
            metrics["history"].append(row)
            print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    seconds = time.perf_counter() - start

    metrics.update(
        {
            "l1_final": l1_distance(torch.bincount(recent, minlength=env.n_states), env),
            "modes_found": count_modes(torch.tensor(sorted(found), dtype=torch.long), env),
            "steps": args.n_steps,
            "trajectories": args.n_steps * args.batch_size,
            "seconds": seconds,
            "traj_per_s": args.n_steps * args.batch_size / seconds,
            "log_z": model.log_z.item(),
        }
    )
    if exact:
        metrics["l1_exact_final"] = _exact_l1(model, env)
    return metrics


def parse_args(argv: list[str] | None = None) -> Args:
    """``--field value`` for every field of ``Args`` (``--uniform-pb`` is a flag)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, action="store_true", default=field.default)
        else:
            kind = {"int": int, "float": float}[str(field.type)]
            parser.add_argument(flag, type=kind, default=field.default)
    return Args(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> dict:
    torch.set_num_threads(1)
    args = parse_args(argv)
    m = train(args)
    print(
        f"L1 (sum over {args.height}**{args.ndim} states, last {args.window} terminals): "
        f"{m['l1_initial']:.4f} untrained -> {m['l1_final']:.4f} after {m['steps']} steps"
    )
    if "l1_exact_final" in m:
        print(f"L1 of the exact P_T: {m['l1_exact_initial']:.4f} -> {m['l1_exact_final']:.4f}")
    print(
        f"log Z: {m['log_z']:.4f} (true {m['true_log_z']:.4f}); "
        f"modes found: {m['modes_found']} / {m['n_modes']}; "
        f"{m['traj_per_s']:.0f} trajectories/s ({m['trajectories']} in {m['seconds']:.1f} s)"
    )
    return m


if __name__ == "__main__":
    main()
