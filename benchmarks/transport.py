"""Ping-pong latency and bandwidth: gflowdist's byte transport vs the raw engines, in one run.

    python benchmarks/transport.py            # full table (MPI and gloo), ~1-2 minutes
    python benchmarks/transport.py --quick    # a few sizes, seconds

Launches itself under ``mpiexec -n 2`` (MPI part) and as 2 gloo processes
(torch part). Raw baselines receive into preallocated buffers; gflowdist
receives with its normal API (a fresh message per call, recycled buffers).
Round-trip times are medians over many repetitions.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from harness import fmt_size, run_mpi_workers, run_torch_workers

SIZES = [8, 1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
QUICK = [8, 1024, 1 << 20]


def reps_for(size: int) -> int:
    return max(10, min(2000, int(2e8 // max(size, 1) // 20)))


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def time_pingpong(rank: int, one_round, reps: int) -> float:
    for _ in range(min(reps, 20)):  # warm up
        one_round()
    samples = []
    batch = max(1, reps // 20)
    for _ in range(reps // batch):
        t0 = time.perf_counter()
        for _ in range(batch):
            one_round()
        samples.append((time.perf_counter() - t0) / batch)
    return _median(samples)


def round_trips(rank: int, peer: int, buf, send, recv, comm):
    """The two ping-pong rounds of one size: raw (``send``/``recv`` into ``buf``) and gflowdist's ``comm``."""
    def raw_round():
        if rank == 0:
            send(buf, peer)
            recv(buf, peer)
        else:
            recv(buf, peer)
            send(buf, peer)

    def ours_round():
        if rank == 0:
            comm.send(buf, peer, 0)
            comm.recv(peer, 0)
        else:
            _, got = comm.recv(peer, 0)
            comm.send(got, peer, 0)

    return raw_round, ours_round


def mpi_worker(sizes) -> None:
    import numpy as np
    from mpi4py import MPI

    from gflowdist.comm.mpi import MPIComm

    world = MPI.COMM_WORLD
    raw = world.Dup()
    comm = MPIComm(world)
    rank, peer = world.rank, 1 - world.rank
    results = []
    for size in sizes:
        reps = reps_for(size)
        buf = np.zeros(size, dtype=np.uint8)
        raw_round, ours_round = round_trips(rank, peer, buf, lambda b, p: raw.Send([b, MPI.BYTE], p, 0),
                                            lambda b, p: raw.Recv([b, MPI.BYTE], p, 0), comm)

        world.Barrier()
        t_raw = time_pingpong(rank, raw_round, reps)
        world.Barrier()
        t_ours = time_pingpong(rank, ours_round, reps)
        world.Barrier()
        results.append({"size": size, "raw": t_raw, "ours": t_ours})
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


def torch_worker(sizes) -> None:
    import torch
    import torch.distributed as dist

    from gflowdist.comm.torch_dist import TorchComm

    dist.init_process_group("gloo")
    comm = TorchComm()
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    results = []
    for size in sizes:
        reps = max(5, reps_for(size) // 4)
        buf = torch.zeros(size, dtype=torch.uint8)
        raw_round, ours_round = round_trips(rank, peer, buf, lambda b, p: dist.send(b, p, tag=7),
                                            lambda b, p: dist.recv(b, p, tag=7), comm)

        dist.barrier()
        t_raw = time_pingpong(rank, raw_round, reps)
        dist.barrier()
        t_ours = time_pingpong(rank, ours_round, reps)
        dist.barrier()
        results.append({"size": size, "raw": t_raw, "ours": t_ours})
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    comm.free()


def run_mpi(sizes):
    return run_mpi_workers(__file__, ["--sizes", ",".join(map(str, sizes))])


def run_torch(sizes):
    return run_torch_workers(__file__, ["--sizes", ",".join(map(str, sizes))])


def table(name: str, rows) -> str:
    lines = [f"\n{name}", f"{'size':>8} | {'raw RTT us':>10} | {'ours RTT us':>11} | {'RTT ratio':>9} | "
             f"{'raw MB/s':>9} | {'ours MB/s':>9} | {'bw % raw':>8}", "-" * 83]
    for r in rows:
        bw_raw = 2 * r["size"] / r["raw"] / 1e6
        bw_ours = 2 * r["size"] / r["ours"] / 1e6
        lines.append(f"{fmt_size(r['size']):>8} | {r['raw'] * 1e6:10.1f} | {r['ours'] * 1e6:11.1f} | "
                     f"{r['ours'] / r['raw']:9.2f} | {bw_raw:9.0f} | {bw_ours:9.0f} | {100 * bw_ours / bw_raw:7.0f}%")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few sizes only")
    parser.add_argument("--worker", choices=["mpi", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--engines", default="mpi,torch", help="comma list of mpi, torch")
    args = parser.parse_args()
    if args.worker:
        sizes = [int(s) for s in args.sizes.split(",")]
        (mpi_worker if args.worker == "mpi" else torch_worker)(sizes)
        return 0
    sizes = QUICK if args.quick else SIZES
    print(f"ping-pong between 2 ranks on {socket.gethostname()}; RTT = median round trip")
    engines = args.engines.split(",")
    if "mpi" in engines:
        print(table("MPI: gflowdist MPIComm send/recv vs raw mpi4py Send/Recv (preallocated)", run_mpi(sizes)))
    if "torch" in engines:
        print(table("gloo: gflowdist TorchComm send/recv vs raw torch.distributed send/recv (preallocated)",
                    run_torch(sizes)))
    print("\ntargets: MPI >= 90% of raw bandwidth from 1 MiB, <= 2x raw RTT up to 1 KiB; "
          "gloo >= 80% of raw bandwidth from 1 MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
