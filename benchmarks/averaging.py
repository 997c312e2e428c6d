"""Gradient averaging: gflowdist's in-place average_gradients vs one raw reduction of the same bytes, in one run.

    python benchmarks/averaging.py            # both models, MPI and gloo, ~2 minutes
    python benchmarks/averaging.py --quick    # fewer repetitions

Launches itself under ``mpiexec -n 2`` (MPI part) and as 2 gloo processes
(torch part). Two models of about 1M float32 parameters: an MLP whose
parameters are 10 tensors, and a deep narrow stack whose parameters are 100
tensors. Per call, median over many repetitions, on rank 0:

- ``raw``: one in-place ``Allreduce(MPI.IN_PLACE, ...)`` (mpi4py) / one
  ``dist.all_reduce`` (gloo) of a contiguous buffer of the same number of
  bytes: the physical limit (a sum, so it does not even divide);
- ``views``: ``average_gradients(model)`` when the gradients already live in
  its buckets (``zero_grad(set_to_none=False)`` and backward): reduce + divide;
- ``fresh``: ``average_gradients(model)`` right after torch's default
  ``zero_grad()`` and a backward pass: backward made new gradient tensors
  and the post-accumulate-grad hooks moved them into the buckets;
- ``assigned``: the caller assigned new ``p.grad`` tensors itself (no
  backward, so no hook ran): the call copies them into the buckets first;
- ``call``: the minimum time of the ``views`` call over a group whose
  reduction returns at once (same rank, same data, same run): what
  gflowdist adds to the reduction (listing the parameters, checking each
  gradient lives in its bucket, the multiply by ``1/n``). On a busy machine
  ``(raw + call) / raw`` over the minimum times estimates the ratio a quiet
  machine gives, where the medians of the other columns mostly time the
  scheduler;
- ``spinup``: Spinning Up's ``mpi_avg_grads``, one ``Allreduce`` per
  parameter through numpy (MPI only); ``per-param``: ``dist.all_reduce(p.grad)``
  then ``/= n`` per parameter (gloo only).

Every variant is in place: each ``p.grad`` keeps its identity and receives
the mean. Where the hooks move gradients during backward, that work is not
in ``fresh``: the second table gives backward's time with and without them.
Ratios are of medians, with the ratio of the minimum times (the calls least
disturbed by other processes on a busy machine) in parentheses.

Importable: :func:`measure` returns the numbers of one engine,
:func:`table` and :func:`backward_table` format them, :func:`summary_rows`
gives ``(label, ms, raw ms, ratio)`` rows for a combined report.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # harness, also when imported from elsewhere
import itertools

from harness import run_mpi_workers, run_torch_workers

__all__ = ["measure", "table", "backward_table", "summary_rows", "TARGET_RATIO"]

#: the goal: views and fresh within this factor of one raw reduction
TARGET_RATIO = 1.25


def make_models():
    import torch

    torch.manual_seed(0)
    dims = [64, 560, 560, 560, 560, 64]  # 5 layers = 10 tensors, ~1.01M parameters
    mlp = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in itertools.pairwise(dims)])
    deep = torch.nn.Sequential(*[torch.nn.Linear(140, 140) for _ in range(50)])  # 100 tensors, ~0.99M
    return {"mlp-10": mlp, "deep-100": deep}


def warm(tensors) -> None:
    """Read every tensor once, so a timed call starts with its data in cache, as right after backward."""
    for t in tensors:
        t.sum()


def backward_of(model, rank: int):
    """A callable running one backward pass of ``model`` (gradients differ between ranks)."""
    import torch

    x = torch.randn(8, model[0].in_features, generator=torch.Generator().manual_seed(rank))

    def run() -> None:
        model(x).square().mean().backward()

    return run


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


def no_reduce_comm(size: int):
    """A communicator of ``size`` ranks whose reductions return at once: what a call costs besides the reduction."""
    from gflowdist.comm.local import LocalComm

    class NoReduce(LocalComm):
        def __init__(self) -> None:
            super().__init__()
            self.size = size

        def all_reduce(self, x, op=None, *, inplace=True):
            return x

        def all_gather_bytes(self, data: bytes) -> list[bytes]:
            return [data] * size

    return NoReduce()


def averaging_cases(model, comm, rank: int, raw) -> dict:
    """Every case of one model (see the module docstring); ``raw`` is the raw reduction's ``(fn, warm)``.

    Before each timed call every case runs one backward pass (untimed), so
    all cases leave the same burst of work behind them: on a loaded machine
    the scheduler treats a process that just computed differently from one
    that idled, and that must not favour one case.
    """
    import copy

    import torch

    from gflowdist.ops import average_gradients

    bare = copy.deepcopy(model)  # never averaged: no hooks, torch's own backward
    run_backward, run_bare = backward_of(model, rank), backward_of(bare, rank)
    run_backward()
    average_gradients(model, comm)  # the first call: buckets and hooks from here on
    no_reduce = no_reduce_comm(comm.size)
    params = list(model.parameters())
    raw_fn, raw_warm = raw

    def raw_before() -> None:
        run_bare()
        raw_warm()

    def views() -> None:
        model.zero_grad(set_to_none=False)
        run_backward()
        warm([p.grad for p in params])

    def fresh() -> None:
        model.zero_grad()
        run_backward()
        warm([p.grad for p in params])

    def assigned() -> None:
        run_bare()
        for p in params:
            p.grad = torch.randn_like(p)

    return {
        "raw": (raw_fn, raw_before),
        "views": (lambda: average_gradients(model, comm), views),
        "fresh": (lambda: average_gradients(model, comm), fresh),
        "assigned": (lambda: average_gradients(model, comm), assigned),
        # the views call over a group whose reduction returns at once: listing, checks, 1/n
        "overhead": (lambda: average_gradients(model, no_reduce), views),
        "bwd_hooks": (run_backward, model.zero_grad),
        "bwd_bare": (run_bare, bare.zero_grad),
    }


def mpi_worker(reps: int) -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    from gflowdist.comm.mpi import MPIComm

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
        baseline = make_models()[name]
        run_baseline = backward_of(baseline, world.Get_rank())

        def spinup_before() -> None:
            baseline.zero_grad()
            run_baseline()

        cases = averaging_cases(
            model,
            comm,
            world.Get_rank(),
            (lambda: raw_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM), lambda: warm([torch.from_numpy(buf)])),
        )
        cases["baseline"] = (lambda: spinup_avg_grads(baseline), spinup_before)
        row = {"tensors": len(list(model.parameters())), "params": numel}
        row.update(median_times(cases, reps, world.Barrier))
        results[name] = row
    if world.Get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


def torch_worker(reps: int) -> None:
    import torch
    import torch.distributed as dist

    from gflowdist.comm.torch_dist import TorchComm

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
        baseline = make_models()[name]
        run_baseline = backward_of(baseline, dist.get_rank())

        def baseline_before() -> None:
            baseline.zero_grad()
            run_baseline()

        cases = averaging_cases(model, comm, dist.get_rank(), (lambda: dist.all_reduce(buf), lambda: warm([buf])))
        cases["baseline"] = (lambda: per_param(baseline), baseline_before)
        row = {"tensors": len(list(model.parameters())), "params": numel}
        row.update(median_times(cases, reps, dist.barrier))
        results[name] = row
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    comm.free()
    dist.destroy_process_group()


def measure(engine: str, reps: int = 200) -> dict:
    """Run the workers of ``engine`` (``"mpi"`` or ``"torch"``, 2 ranks); per model, seconds per call."""
    runner = run_mpi_workers if engine == "mpi" else run_torch_workers
    return runner(os.path.abspath(__file__), ["--reps", str(reps)])


BASELINE_LABEL = {"mpi": "spinup", "torch": "per-param"}


def _ratio(r: dict, a: str, b: str) -> str:
    return f"{r[a] / r[b]:.2f} ({r[a + '_min'] / r[b + '_min']:.2f})"


def table(engine: str, results: dict) -> str:
    """Median ms per call, then ratios of medians with ratios of minimums in parentheses."""
    label = BASELINE_LABEL[engine]
    raw = "raw Allreduce" if engine == "mpi" else "raw all_reduce"
    head = (
        f"{'model':>9} | {'tensors':>7} | {'raw ms':>6} | {'views ms':>8} | {'fresh ms':>8} | "
        f"{'assigned ms':>11} | {label + ' ms':>12} | {'views/raw':>11} | {'fresh/raw':>11} | "
        f"{'assigned/raw':>12} | {label + '/fresh':>15} | {'call ms':>7} | {'(raw+call)/raw':>14}"
    )
    lines = [
        f"\n{engine}: in-place average_gradients vs one {raw} of the same bytes (raw) and {label}",
        head,
        "-" * len(head),
    ]
    for name, r in results.items():
        lines.append(
            f"{name:>9} | {r['tensors']:7d} | {r['raw'] * 1e3:6.2f} | {r['views'] * 1e3:8.2f} | "
            f"{r['fresh'] * 1e3:8.2f} | {r['assigned'] * 1e3:11.2f} | {r['baseline'] * 1e3:12.2f} | "
            f"{_ratio(r, 'views', 'raw'):>11} | {_ratio(r, 'fresh', 'raw'):>11} | "
            f"{_ratio(r, 'assigned', 'raw'):>12} | {_ratio(r, 'baseline', 'fresh'):>15} | "
            f"{r['overhead_min'] * 1e3:7.3f} | {(r['raw_min'] + r['overhead_min']) / r['raw_min']:14.2f}"
        )
    return "\n".join(lines)


def backward_table(engine: str, results: dict) -> str:
    """Backward's time with the hooks that move fresh gradients into the buckets, and without."""
    head = f"{'model':>9} | {'bwd ms':>6} | {'bwd+hooks ms':>12} | {'hooks cost ms':>13} | {'ratio':>11}"
    lines = [
        f"\n{engine}: one backward pass (batch 8) after zero_grad(), torch alone vs with the hooks",
        head,
        "-" * len(head),
    ]
    for name, r in results.items():
        lines.append(
            f"{name:>9} | {r['bwd_bare'] * 1e3:6.2f} | {r['bwd_hooks'] * 1e3:12.2f} | "
            f"{(r['bwd_hooks'] - r['bwd_bare']) * 1e3:13.2f} | {_ratio(r, 'bwd_hooks', 'bwd_bare'):>11}"
        )
    return "\n".join(lines)


def summary_rows(engine: str, results: dict) -> list[tuple[str, float, float, float]]:
    """``(label, ms per call, raw ms, ratio of medians)`` for views and fresh of each model."""
    return [
        (f"average_gradients {engine} {name} {case}", r[case] * 1e3, r["raw"] * 1e3, r[case] / r["raw"])
        for name, r in results.items()
        for case in ("views", "fresh")
    ]


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
    load = os.getloadavg()[0]
    print(
        f"gradient averaging between 2 ranks on {socket.gethostname()}; median per call over {reps} calls; "
        f"load average {load:.2f} at start"
    )
    for engine in args.engines.split(","):
        results = measure(engine, reps)
        print(table(engine, results))
        print(backward_table(engine, results))
    print(
        f"\ntarget: views and fresh within {TARGET_RATIO}x of raw on both models; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
