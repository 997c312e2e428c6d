"""An OmniSafe-style script on gflowdist: fork(), setup_distributed(), avg_grads and pooled statistics.

What it shows: OmniSafe's entry pattern — ``if distributed.fork(parallel):
sys.exit()`` re-running the script under torchrun, then
``setup_distributed()`` — and its training helpers: ``sync_params`` at the
start, ``avg_grads`` after each backward, ``dist_statistics_scalar`` for
logging a quantity whose count differs per process (here each process
evaluates a different number of samples, which the original cannot pool).
The task: each process fits a small network to noisy samples of sin(x).

Run:

    python examples/omnisafe_style.py --parallel 2        # fork() runs 2 workers under torchrun
    mpiexec -n 2 python examples/omnisafe_style.py        # already a job: fork() returns False
    python examples/omnisafe_style.py                     # one process

Before (OmniSafe):

    from omnisafe.utils import distributed

After: the import below marked "the only change".
"""

from __future__ import annotations

import argparse
import sys

import torch

# the only change: gflowdist.compat.omnisafe instead of omnisafe.utils.distributed
from gflowdist.compat import omnisafe as distributed


def train(steps: int, seed: int) -> torch.nn.Module:
    distributed.setup_distributed()
    rank = distributed.get_rank()
    torch.manual_seed(seed + rank)
    net = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    distributed.sync_params(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for step in range(steps):
        x = torch.rand(64, 1) * 6 - 3
        y = torch.sin(x) + 0.05 * torch.randn_like(x)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        distributed.avg_grads(net)
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            with torch.no_grad():
                probe = torch.rand(10 + 5 * rank, 1) * 6 - 3  # a different count on every process
                errors = (net(probe) - torch.sin(probe)).abs().squeeze(-1)
            mean, std, lo, hi = distributed.dist_statistics_scalar(errors, with_min_and_max=True)
            if distributed.is_master():
                print(
                    f"step {step:4d}  |error| {float(mean):.4f} +- {float(std):.4f} "
                    f"[{float(lo):.4f}, {float(hi):.4f}]  world {distributed.world_size()}",
                    flush=True,
                )
    return net


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=1, help="worker processes (fork re-runs this script)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--seed", type=int, default=0, help="seed; process r uses seed + r")
    args = parser.parse_args()
    if distributed.fork(args.parallel):
        sys.exit(0)  # the parent: the workers have finished
    model = train(args.steps, args.seed)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    print(f"FINAL rank {distributed.get_rank()} of {distributed.world_size()} params {checksum:.10f}", flush=True)
