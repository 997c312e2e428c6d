"""What a message to a replaced actor costs: the routed intercommunicator against the world, in one run.

    python benchmarks/routes.py                 # 2000 round trips and 2000 streamed messages of each size
    python benchmarks/routes.py --messages 500

``mpiexec -n 3`` of this file: rank 2 (the "actor") takes no part, as a lost actor; ranks 0 and 1 spawn one
spare together (``MPI_Comm_create_group`` + ``MPI_Comm_spawn``, as ``faults.on_actor_loss: replace`` does at
start-up, :func:`gflowdist.runtime.spares.start_spares`), which stands in as rank 2
(:meth:`gflowdist.comm.mpi.MPIComm.standing_in`), and rank 0 routes rank 2 to it
(:meth:`gflowdist.comm.mpi.MPIComm.route`). Then, each through gflowdist's :class:`~gflowdist.comm.mpi.MPIComm`:

- **round trip**: rank 0 sends a message and waits for the echo, from rank 1 over the world (the baseline) and
  from rank 2 over the route, alternated in blocks;
- **stream**: the peer sends a burst of messages (``isend``, as an actor ships batches) that rank 0 receives
  with ``recv(None)``, as a buffer does, over the world and over the route.

Sizes: 416 bytes (a toy batch) and 64 KiB. The table gives microseconds per round trip and messages per second
received, and the routed / world ratio of each (the baseline: the world, same run, same processes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIZES = (416, 64 << 10)
BLOCKS = 4  # round trips alternate between the world and the route in this many blocks


def _rank_main(messages: int) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice that rank 2 ended
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent != MPI.COMM_NULL:
        _spare(parent, messages)
        return
    world = MPI.COMM_WORLD
    from gflowdist.comm.mpi import MPIComm

    me = MPIComm(world)  # collective over the world (a duplicate of it)
    if world.rank == 2:  # the "lost" actor: takes no part (it waits for the end: an early exit upsets hydra)
        world.Barrier()
        os._exit(0)
    comm = world.Create_group(world.Get_group().Incl([0, 1]), 7)
    inter = comm.Spawn(sys.executable, args=[__file__, "--rank", "--messages", str(messages)], maxprocs=1, root=0)
    if world.rank == 1:
        _echo_and_stream(me, 0, messages)
        world.Barrier()
        os._exit(0)
    me.route(2, inter, 0)
    result = _measure(me, messages)
    world.Barrier()
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)


def _spare(parent, messages: int) -> None:
    from gflowdist.comm.mpi import MPIComm

    me = MPIComm.standing_in(2, 3, {0: (parent, 0), 1: (parent, 1)})
    _echo_and_stream(me, 0, messages)
    time.sleep(1.0)
    os._exit(0)


def _echo_and_stream(me, peer: int, messages: int) -> None:
    import torch

    for size in SIZES:
        payload = torch.zeros(size, dtype=torch.uint8)
        for _ in range(messages):  # echo
            _, got = me.recv(peer, tag=1, timeout=60)
            me.send(got, peer, tag=1)
        me.recv(peer, tag=2, timeout=60)  # go
        handles = [me.isend(payload, peer, tag=3) for _ in range(messages)]
        for handle in handles:
            handle.wait(60)


def _measure(me, messages: int) -> dict:
    import torch

    result: dict = {}
    for size in SIZES:
        payload = torch.zeros(size, dtype=torch.uint8)
        trips: dict[int, list[float]] = {1: [], 2: []}
        per_block = messages // BLOCKS
        for block in range(BLOCKS):
            for peer in (1, 2) if block % 2 == 0 else (2, 1):
                count = per_block if block < BLOCKS - 1 else messages - per_block * (BLOCKS - 1)
                start = time.perf_counter()
                for _ in range(count):
                    me.send(payload, peer, tag=1)
                    me.recv(peer, tag=1, timeout=60)
                trips[peer].append((time.perf_counter() - start) / count * 1e6)
        streams = {}
        for peer in (1, 2):
            me.send(b"go", peer, tag=2)
            start = time.perf_counter()
            for _ in range(messages):
                me.recv(None if peer == 2 else peer, tag=3, timeout=60)
            streams[peer] = messages / (time.perf_counter() - start)
        result[str(size)] = {
            "world_us": statistics.median(trips[1]),
            "routed_us": statistics.median(trips[2]),
            "world_msgs": streams[1],
            "routed_msgs": streams[2],
        }
    return result


def measure(messages: int) -> dict:
    """Run the three ranks and the spare (see the module docstring); rank 0's numbers."""
    from gflowdist.jobenv import find_mpiexec, without_launcher

    cmd = [find_mpiexec(), "-disable-auto-cleanup", "-n", "3", sys.executable, __file__, "--rank"]
    cmd += ["--messages", str(messages)]
    env = dict(without_launcher(dict(os.environ)), PYTHONUNBUFFERED="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parent)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"no result (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def table(result: dict) -> list[str]:
    lines = [f"{'size':>8} {'world us/trip':>14} {'routed us/trip':>15} {'ratio':>7} "]
    lines[0] += f"{'world msgs/s':>13} {'routed msgs/s':>14} {'ratio':>7}"
    for size, r in result.items():
        lines.append(
            f"{int(size):>8} {r['world_us']:>14.1f} {r['routed_us']:>15.1f} {r['routed_us'] / r['world_us']:>6.2f}x "
            f"{r['world_msgs']:>13.0f} {r['routed_msgs']:>14.0f} {r['routed_msgs'] / r['world_msgs']:>6.2f}x"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="200 messages of each kind")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # one of the ranks, under mpiexec
    args = parser.parse_args(argv)
    messages = 200 if args.quick else args.messages
    if args.rank:
        _rank_main(messages)
        return 0
    result = measure(messages)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {messages} messages of each kind")
    print("\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
