"""Gradient averaging: gflowdist's flat-bucket average_gradients vs per-parameter collectives, in one run.

    python benchmarks/averaging.py            # both models, MPI and gloo, ~1 minute
    python benchmarks/averaging.py --quick    # fewer repetitions

Launches itself under ``mpiexec -n 2`` (MPI part) and as 2 gloo processes
(torch part). Two models of about 1M float32 parameters: an MLP whose
parameters are 10 tensors, and a deep narrow stack whose parameters are 100
tensors. Per call, median over many repetitions, on rank 0:

- ``raw``: one in-place ``Allreduce`` (MPI) / ``all_reduce`` (gloo) over a
  contiguous buffer of the same number of bytes: the physical limit;
- ``ours (views)``: ``average_gradients(model)`` when the gradients are
  already views of its bucket (after the first call, with
  ``zero_grad(set_to_none=False)``): reduce + divide;
- ``ours (fresh)``: ``average_gradients(model)`` when backward left fresh
  gradient tensors (``zero_grad()`` default): copy in + reduce + divide;
- ``spinup``: Spinning Up's ``mpi_avg_grads``, one ``Allreduce`` per
  parameter through numpy (MPI only);
- ``torch per-param``: ``dist.all_reduce(p.grad)`` then ``/= n`` per
  parameter (gloo only).

The table gives medians in ms, then ratios of medians with the ratios of
the minimum times (the calls least disturbed by other processes on a busy
machine) in parentheses.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from harness import run_mpi_workers, run_torch_workers


def make_models():
    import torch

    torch.manual_seed(0)
    dims = [64, 560, 560, 560, 560, 64]  # 5 layers = 10 tensors, ~1.01M parameters
    mlp = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])])
    deep = torch.nn.Sequential(*[torch.nn.Linear(140, 140) for _ in range(50)])  # 100 tensors, ~0.99M
    return {"mlp-10": mlp, "deep-100": deep}


def warm(tensors) -> None:
    """Read every tensor once, so a timed call starts with its data in cache, as right after backward."""
    for t in tensors:
        t.sum()


def grad_setters(model, comm):
    """``(fresh, views)``: callables giving the model fresh random gradients, or views of its bucket.

    Each also warms the gradients it installs (see :func:`warm`).
    """
    import torch

    from gflowdist.ops import average_gradients

    fresh = [torch.randn_like(p) for p in model.parameters()]
    for p, g in zip(model.parameters(), fresh):
        p.grad = g
    average_gradients(model, comm)  # copies them into the bucket; the grads become its views
    views = [p.grad for p in model.parameters()]

    def setter(grads):
        def set_grads() -> None:
            for p, g in zip(model.parameters(), grads):
                p.grad = g
            warm(grads)
        return set_grads

    return setter(fresh), setter(views)


def median_times(cases: dict, reps: int, barrier) -> dict[str, float]:
    """Median and minimum seconds per call of each case (``name`` and ``name + "_min"``).

    Cases take turns every repetition, so load noise hits all alike (each
    case's ``before`` warms its own data, so none profits from another's cache); the
    minimum is the call least disturbed by other processes. ``cases`` maps a
    name to ``(fn, before)``; ``before`` (or None) runs untimed before each call.
    """
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(reps + 5):
        for name, (fn, before) in cases.items():
            if before is not None:
                before()
            barrier()
            t0 = time.perf_counter()
            fn()
            if rep >= 5:  # the first rounds warm up
                samples[name].append(time.perf_counter() - t0)
    out = {name: sorted(values)[len(values) // 2] for name, values in samples.items()}
    out.update({name + "_min": min(values) for name, values in samples.items()})
    return out


def mpi_worker(reps: int) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from gflowdist.comm.mpi import MPIComm
    from gflowdist.ops import average_gradients

    world = MPI.COMM_WORLD
    raw_comm = world.Dup()
    comm = MPIComm(world)
    n = world.Get_size()

    def spinup_avg_grads(module) -> None:  # spinup.utils.mpi_pytorch.mpi_avg_grads, verbatim logic
        for p in module.parameters():
            p_grad_numpy = p.grad.numpy()
            x = np.asarray(p.grad, dtype=np.float32)
            buff = np.zeros_like(x, dtype=np.float32)
            raw_comm.Allreduce(x, buff, op=MPI.SUM)
            p_grad_numpy[:] = (buff / n)[:]

    results = {}
    for name, model in make_models().items():
        numel = sum(p.numel() for p in model.parameters())
        buf = np.ones(numel, dtype=np.float32)
        restore_fresh, restore_views = grad_setters(model, comm)

        row = {"tensors": len(list(model.parameters())), "params": numel}
        row.update(median_times({
            "raw": (lambda: raw_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), lambda: warm([torch.from_numpy(buf)])),
            "views": (lambda: average_gradients(model, comm), restore_views),
            "fresh": (lambda: average_gradients(model, comm), restore_fresh),
            "spinup": (lambda: spinup_avg_grads(model), restore_fresh),
        }, reps, world.Barrier))
        results[name] = row
    if world.Get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def torch_worker(reps: int) -> None:
    import torch
    import torch.distributed as dist

    from gflowdist.comm.torch_dist import TorchComm
    from gflowdist.ops import average_gradients

    dist.init_process_group("gloo")
    comm = TorchComm()
    n = dist.get_world_size()

    def per_param(module) -> None:
        for p in module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= n

    results = {}
    for name, model in make_models().items():
        numel = sum(p.numel() for p in model.parameters())
        buf = torch.ones(numel)
        restore_fresh, restore_views = grad_setters(model, comm)

        row = {"tensors": len(list(model.parameters())), "params": numel}
        row.update(median_times({
            "raw": (lambda: dist.all_reduce(buf), lambda: warm([buf])),
            "views": (lambda: average_gradients(model, comm), restore_views),
            "fresh": (lambda: average_gradients(model, comm), restore_fresh),
            "per_param": (lambda: per_param(model), restore_fresh),
        }, reps, dist.barrier))
        results[name] = row
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    comm.free()
    dist.destroy_process_group()


def run_mpi(reps: int) -> dict:
    return run_mpi_workers(__file__, ["--reps", str(reps)])


def run_torch(reps: int) -> dict:
    return run_torch_workers(__file__, ["--reps", str(reps)])


def table(title: str, results: dict, baseline: str, label: str) -> str:
    """Median ms per call, then ratios of medians with ratios of minimums in parentheses."""
    def ratio(a: str, b: str, r: dict) -> str:
        return f"{r[a] / r[b]:.2f} ({r[a + '_min'] / r[b + '_min']:.2f})"

    head = (f"{'model':>9} | {'tensors':>7} | {'raw ms':>6} | {'views ms':>8} | {'fresh ms':>8} | "
            f"{label + ' ms':>12} | "
            f"{'views/raw':>11} | {'fresh/raw':>11} | {label + '/views':>15} | {label + '/fresh':>15}")
    lines = [f"\n{title}", head, "-" * len(head)]
    for name, r in results.items():
        lines.append(f"{name:>9} | {r['tensors']:7d} | {r['raw'] * 1e3:6.2f} | {r['views'] * 1e3:8.2f} | "
                     f"{r['fresh'] * 1e3:8.2f} | {r[baseline] * 1e3:12.2f} | "
                     f"{ratio('views', 'raw', r):>11} | {ratio('fresh', 'raw', r):>11} | "
                     f"{ratio(baseline, 'views', r):>15} | {ratio(baseline, 'fresh', r):>15}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--engines", default="mpi,torch", help="comma list of mpi, torch")
    args = parser.parse_args()
    if args.worker:
        (mpi_worker if args.worker == "mpi" else torch_worker)(args.reps)
        return 0
    reps = 40 if args.quick else args.reps
    print(f"gradient averaging between 2 ranks on {socket.gethostname()}; median per call over {reps} calls")
    engines = args.engines.split(",")
    if "mpi" in engines:
        print(table("MPI: gflowdist average_gradients vs one raw Allreduce (raw) and Spinning Up mpi_avg_grads",
                    run_mpi(reps), "spinup", "spinup"))
    if "torch" in engines:
        print(table("gloo: gflowdist average_gradients vs one raw all_reduce (raw) and one all_reduce per parameter",
                    run_torch(reps), "per_param", "per-param"))
    print("\ntargets: ours within 1.25x of raw on both models; >= 2x faster than Spinning Up on mlp-10")
    return 0


if __name__ == "__main__":
    sys.exit(main())
