"""A VirTex-style training script on gflowdist: launch(), averaged loss dicts, master-only logging.

What it shows: VirTex's ``scripts/pretrain_virtex.py`` pattern —
``launch(main, num_gpus_per_machine=..., dist_url=...)`` starting one
process per device, ``average_across_processes`` on a dict of losses for
logging, ``synchronize`` and ``is_master_process`` — running on CPU with
gloo (the original insists on NCCL). Gradients are averaged by
``gflowdist.DistributedOptimizer`` (VirTex wraps its model in DDP, which
needs a torch process group; this works under mpiexec too). Each process
fits a linear model to its own shard of a synthetic regression problem.

Run:

    python examples/virtex_style.py --num-procs 2                 # launch() spawns 2 gloo workers
    mpiexec -n 2 python examples/virtex_style.py --num-procs 2    # already a job: launch() runs in place
    python examples/virtex_style.py                               # one process

Before (VirTex):

    import virtex.utils.distributed as dist

After: the import below marked "the only change" (plus the optimizer wrapper
in place of DDP).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

import gflowdist

# the only change: gflowdist.compat.virtex instead of virtex.utils.distributed
from gflowdist.compat import virtex as dist


@dataclasses.dataclass
class Args:
    num_procs: int = 1
    """processes on this machine (VirTex: --num-gpus-per-machine)"""
    num_machines: int = 1
    """machines taking part"""
    machine_rank: int = 0
    """this machine's index"""
    dist_url: str = "auto"
    """rendezvous URL; "auto" picks a free port on one machine"""
    steps: int = 60
    """optimizer steps"""
    batch: int = 32
    """samples per process per step"""
    lr: float = 0.1
    """learning rate"""
    seed: int = 0
    """seed of the ground truth (identical everywhere) and, plus the rank, of each process's data"""


def main(args: Args) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    truth = torch.Generator().manual_seed(args.seed)
    true_w = torch.randn(8, 1, generator=truth)
    data = torch.Generator().manual_seed(args.seed + 1 + rank)  # each process its own shard
    model = torch.nn.Linear(8, 1)
    optimizer = gflowdist.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr))
    for step in range(args.steps):
        x = torch.randn(args.batch, 8, generator=data)
        y = x @ true_w + 0.01 * torch.randn(args.batch, 1, generator=data)
        optimizer.zero_grad()
        mse = torch.nn.functional.mse_loss(model(x), y)
        l1 = model.weight.abs().mean()
        (mse + 1e-4 * l1).backward()
        optimizer.step()
        losses = {"loss": (mse + 1e-4 * l1).detach(), "parts": {"mse": mse.detach(), "l1": l1.detach()}}
        dist.average_across_processes(losses)  # in place, for logging
        if dist.is_master_process() and step % 20 == 0:
            print(
                f"step {step:3d}  loss {float(losses['loss']):.5f}  mse {float(losses['parts']['mse']):.5f}  "
                f"world {world}",
                flush=True,
            )
    dist.synchronize()
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    error = float((model.weight.detach().T - true_w).abs().max())
    print(f"FINAL rank {rank} of {world} params {checksum:.10f} max_weight_error {error:.4f}", flush=True)


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Args):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return Args(**vars(parser.parse_args()))


if __name__ == "__main__":
    arguments = parse_args()
    dist.launch(
        main,
        num_machines=arguments.num_machines,
        num_gpus_per_machine=arguments.num_procs,
        machine_rank=arguments.machine_rank,
        dist_url=arguments.dist_url,
        args=(arguments,),
    )
