"""torchgfn's ``gfn/utils/distributed.py`` and gflowdist.compat.torchgfn, side by side on gloo ranks.

Run as N processes with torch's env:// variables:
``python tests/jobs/torchgfn_differential.py <path of the original file>``
(see tests/test_compat_originals.py). The original (2.4.1 from its wheel, or
the newest kept in tests/originals) is loaded as a file of its own. Every
rank feeds both the same rank-dependent inputs and checks the same bits; it
prints ``SAME <check>`` for each and ``TORCHGFN DIFFERENTIAL OK <n>`` at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gflowdist.compat import torchgfn as compat
from tests.support.originals import load_file

# one write per line: mpiexec never glues two ranks' lines (PYTHONUNBUFFERED writes the newline apart)
sys.stdout.reconfigure(line_buffering=True, write_through=False)

orig = load_file(Path(sys.argv[1]), "torchgfn_distributed_original")
dist.init_process_group("gloo")
RANK, SIZE = dist.get_rank(), dist.get_world_size()


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape or a.numpy().tobytes() != b.numpy().tobytes():
        raise AssertionError(f"{what}: original {a!r} vs compat {b!r} on rank {RANK}")


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 300), torch.nn.Tanh(), torch.nn.Linear(300, 3))


def grads_through(average) -> list[torch.Tensor]:
    net = model(3)
    torch.manual_seed(100 + RANK)
    net(torch.randn(8, 5)).pow(2).mean().backward()
    average(net)
    return [p.grad.clone() for p in net.parameters()]


def params_through(average) -> list[torch.Tensor]:
    net = model(200 + RANK)
    average(net)
    return [p.detach().clone() for p in net.parameters()]


def main() -> None:
    torch.set_num_threads(1)
    for i, (a, b) in enumerate(
        zip(grads_through(orig.average_gradients), grads_through(compat.average_gradients), strict=True)
    ):
        same(a, b, f"average_gradients[{i}]")
    print("SAME average_gradients", flush=True)
    for i, (a, b) in enumerate(
        zip(params_through(orig.average_models), params_through(compat.average_models), strict=True)
    ):
        same(a, b, f"average_models[{i}]")
    print("SAME average_models", flush=True)
    rng = np.random.default_rng(RANK)
    # integer states, as torchgfn gathers them (it sends the row counts in the data's dtype, and a
    # float count cannot slice: its float path fails, documented in docs/migration-torchgfn.md)
    rows = torch.from_numpy(rng.integers(-1000, 1000, size=(3 + 2 * RANK, 4)))
    theirs = orig.gather_distributed_data(rows.clone())
    ours = compat.gather_distributed_data(rows.clone())
    if RANK == 0:
        same(theirs, ours, "gather_distributed_data")
    elif theirs is not None or ours is not None:
        raise AssertionError(f"gather_distributed_data on rank {RANK}: {theirs!r} / {ours!r}, expected None")
    print("SAME gather_distributed_data", flush=True)
    print(f"TORCHGFN DIFFERENTIAL OK {SIZE}", flush=True)
    # torch's rule for a script that made its process group: destroy it before exit. Without this, a
    # gloo worker may drop its last finished work while the interpreter shuts down and abort the rank
    # ("terminate called without an active exception", about 1 run in 16 under load)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
