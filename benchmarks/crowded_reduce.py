"""A crowded machine's all-reduce: shared memory and doorbells against the engine's own, in one run.

    python benchmarks/crowded_reduce.py            # 3 MPI ranks and 3 gloo processes, about a minute
    python benchmarks/crowded_reduce.py --quick    # fewer calls, seconds
    python benchmarks/crowded_reduce.py --engines mpi --ranks 4

Each engine's ranks (``--ranks``, 3 by default, so more than this 2-core machine's cores) set their waits to a
crowded machine's (``gflowdist.comm.polling.set_crowded``, as ``gflowdist run`` does where the job's ranks
outnumber the cores) and keep a keep-alive hook set, as the runtime does. Two communicators over the same
ranks: ``engine`` never uses shared memory (MPI's ``Iallreduce`` or gloo's ``all_reduce``, polled),
``shared`` is the group's :mod:`gflowdist.comm.host_reduce` all-reduce. Batches of calls alternate between
the two (engine, shared, engine, ...) so both see the same machine. Two cases per array size:

- ``back to back``: calls with nothing between them (the peers are already there: the engine's spin
  catches them, this is where it is at its best);
- ``with work``: before each call every rank works 0.5-1.5 ms of CPU (a different amount on each rank and
  call, as trainers' steps differ), so the ranks arrive apart and wait for the last one, as in a job.

Columns: the median wall time per call and the median CPU time per call (``time.thread_time``: what the
wait takes from the cores), each with the ratio shared / engine (below 1: shared memory is faster).
The work itself is not counted in ``with work``'s times: only the call's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time

from harness import run_mpi_workers, run_torch_workers

SIZES = [100, 10_000, 50_000, 1_000_000]  # float32 elements
QUICK = [100, 50_000]


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def busy(seconds: float) -> None:
    """CPU work for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1


def measure(comms: dict, barrier, rank: int, n: int, calls: int, work: bool) -> dict:
    """Per communicator: per-batch medians of wall and CPU seconds per call, batches alternated."""
    import torch

    pace = random.Random(1000 * rank + n)
    arrays = {name: torch.ones(n) for name in comms}
    for name, comm in comms.items():  # warm up (opens the shared mapping at this size)
        for _ in range(5):
            comm.all_reduce(arrays[name])
    samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in comms}
    batch = max(1, calls // 10)
    for _ in range(10):
        for name, comm in comms.items():
            barrier()
            wall = cpu = 0.0
            for _ in range(batch):
                if work:
                    busy(0.0005 + 0.001 * pace.random())
                t0, c0 = time.perf_counter(), time.thread_time()
                comm.all_reduce(arrays[name])
                wall += time.perf_counter() - t0
                cpu += time.thread_time() - c0
            samples[name]["wall"].append(wall / batch)
            samples[name]["cpu"].append(cpu / batch)
    return {name: {k: _median(v) for k, v in s.items()} for name, s in samples.items()}


def worker(engine: str, sizes: list[int], calls: int) -> None:
    from gflowdist.comm.host_reduce import HostReduce
    from gflowdist.comm.polling import set_crowded

    if engine == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    from gflowdist.comm import world_comm

    set_crowded(True)
    world = world_comm(engine)
    if engine == "mpi":
        from gflowdist.comm.mpi import MPIComm

        plain, shared = MPIComm(world.mpi_comm.Dup()), MPIComm(world.mpi_comm.Dup())
    else:
        everyone = [list(range(world.size))]
        plain, shared = world.split(everyone), world.split(everyone)
    plain._host = False  # this one keeps the engine's all-reduce
    for comm in (plain, shared):
        comm.wait_hook = lambda: None  # as the runtime's keep-alive hook: the engines' polled path
    rows = []
    for n in sizes:
        for work in (False, True):
            calls_here = max(20, calls // (10 if n >= 1_000_000 else 1) // (4 if work else 1))
            times = measure({"engine": plain, "shared": shared}, world.barrier, world.rank, n, calls_here, work)
            rows.append({"n": n, "work": work, **times})
    if not isinstance(shared._host, HostReduce):
        raise RuntimeError(f"the shared communicator did not open a shared mapping ({shared._host!r})")
    if world.rank == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    shared.free()
    plain.free()


def table(engine: str, ranks: int, rows: list[dict]) -> str:
    lines = [
        f"\n{engine}: {ranks} crowded ranks, all_reduce of float32 arrays",
        f"{'elements':>9} | {'case':<12} | {'engine us':>9} | {'shared us':>9} | {'ratio':>5} | "
        f"{'engine CPU us':>13} | {'shared CPU us':>13} | {'ratio':>5}",
        "-" * 96,
    ]
    for r in rows:
        e, s = r["engine"], r["shared"]
        lines.append(
            f"{r['n']:>9,} | {'with work' if r['work'] else 'back to back':<12} | {e['wall'] * 1e6:9.1f} | "
            f"{s['wall'] * 1e6:9.1f} | {s['wall'] / e['wall']:5.2f} | {e['cpu'] * 1e6:13.1f} | "
            f"{s['cpu'] * 1e6:13.1f} | {s['cpu'] / e['cpu']:5.2f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, fewer calls")
    parser.add_argument("--engines", default="mpi,torch", help="comma list of mpi, torch")
    parser.add_argument("--ranks", type=int, default=3, help="ranks per engine (default 3)")
    parser.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write every measurement to this file")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (QUICK if args.quick else SIZES)
    calls = args.calls or (200 if args.quick else 1000)
    if args.worker:
        worker(args.worker, sizes, calls)
        return 0
    print(
        f"crowded all-reduce on {socket.gethostname()}, {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f} at the start",
        flush=True,
    )
    every = {}
    worker_args = ["--sizes", ",".join(map(str, sizes)), "--calls", str(calls)]
    for engine in args.engines.split(","):
        run = run_mpi_workers if engine == "mpi" else run_torch_workers
        every[engine] = run(__file__, worker_args, nprocs=args.ranks)
        print(table(engine, args.ranks, every[engine]), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(every, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
