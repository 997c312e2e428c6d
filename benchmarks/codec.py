"""Wire codec benchmark: encode + decode of trajectory batches against pickle-5 and torch.save.

Run:  .venv/bin/python benchmarks/codec.py [--repeats 7] [--min-time 0.05] [--clock cpu|wall]

The payload is a trajectory batch of B trajectories of length 20 in a 4-d state space:

    states int64 [B, 20, 4], actions int64 [B, 20], log_rewards float32 [B], done bool [B, 20]

for B = 64, 640 and 6400 (1x, 10x, 100x), once as torch tensors and once as
numpy arrays. Each method turns the batch into bytes and back in one process:

    gflowdist       decode(encode(...))              arrays arrive as views of the message
    gflowdist copy  decode(encode(...), copy=True)   arrays arrive owned, like pickle's
    pickle-5        pickle.loads(pickle.dumps(batch, protocol=5))         (in-band)
    pickle-5 oob    dumps with buffer_callback, loads(buffers=...)        (out-of-band)
    torch.save      torch.save into BytesIO, torch.load(weights_only=True) (torch payload only)

Every time is the median over ``--repeats`` repetitions of the mean per
round trip of a loop lasting at least ``--min-time`` seconds; the methods of
one row take turns within each repetition, so a burst of load elsewhere hits
them alike. The default clock is this process's CPU time (``--clock wall`` for
wall time): on a shared machine it is not inflated by time spent descheduled.
``ratio`` is pickle-5 time / gflowdist time (above 1: the codec is faster).
The last lines time a tiny body with no arrays (the per-message overhead).
pickle appears here only as a baseline; gflowdist itself never pickles.

End to end (``--e2e``, on by default; ``--no-e2e`` to skip): 2 MPI ranks
stream the 100x torch batch; gflowdist encodes, sends over MPIComm, receives
and decodes each message, against raw mpi4py ``Send``/``Recv`` of the same
number of bytes between preallocated buffers, in the same run. Bandwidth is
bytes / wall time per message (median of several rounds).
"""

from __future__ import annotations

import argparse
import functools
import io
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gflowdist.transport import MessageType, decode, encode

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from harness import run_mpi_workers

SCALES = (1, 10, 100)
BASE_BATCH = 64
LENGTH = 20
STATE_DIM = 4


def trajectory_batch(batch: int, *, as_torch: bool) -> dict[str, Any]:
    """The benchmark payload for ``batch`` trajectories (deterministic contents)."""
    rng = np.random.default_rng(batch)
    body = {
        "states": rng.integers(0, 16, (batch, LENGTH, STATE_DIM), dtype=np.int64),
        "actions": rng.integers(0, 5, (batch, LENGTH), dtype=np.int64),
        "log_rewards": rng.standard_normal(batch, dtype=np.float32),
        "done": rng.random((batch, LENGTH)) < 0.1,
    }
    return {key: torch.from_numpy(value) for key, value in body.items()} if as_torch else body


def codec_roundtrip(body: Any, copy: bool = False) -> Any:
    return decode(encode(MessageType.TRAJECTORIES, body, sender=0, seq=1), sender=0, copy=copy).body


def pickle_inband(body: Any) -> Any:
    return pickle.loads(pickle.dumps(body, protocol=5))


def pickle_out_of_band(body: Any) -> Any:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(body, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=buffers)


def torch_save_load(body: Any) -> Any:
    stream = io.BytesIO()
    torch.save(body, stream)
    stream.seek(0)
    return torch.load(stream, weights_only=True)


def measure(
    calls: dict[str, Callable[[], Any]], *, repeats: int, min_time: float, clock: Callable[[], float]
) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns in every repetition."""
    loops = {}
    for name, call in calls.items():
        call()  # warm up (imports, allocator)
        count = 1
        while True:
            started = clock()
            for _ in range(count):
                call()
            if clock() - started >= min_time:
                break
            count *= 2
        loops[name] = count
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            count = loops[name]
            started = clock()
            for _ in range(count):
                call()
            samples[name].append((clock() - started) / count)
    return {name: statistics.median(values) for name, values in samples.items()}


def _format_time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def _check_equal(body: dict[str, Any], out: dict[str, Any]) -> None:
    for key, value in body.items():
        if isinstance(value, torch.Tensor):
            same = type(out[key]) is torch.Tensor and torch.equal(out[key], value)
        else:
            same = type(out[key]) is np.ndarray and np.array_equal(out[key], value)
        if not same:
            raise SystemExit(f"round trip changed {key!r}; benchmark aborted")


def e2e_worker(messages: int, rounds: int) -> None:
    """Rank 0 streams ``messages`` 100x batches to rank 1 per round, gflowdist vs raw, alternating."""
    import json

    from mpi4py import MPI

    from gflowdist.comm.mpi import MPIComm
    from gflowdist.transport.channel import Channel

    world = MPI.COMM_WORLD
    raw = world.Dup()
    channel = Channel(MPIComm(world), tag=1, max_in_flight=4)
    body = trajectory_batch(BASE_BATCH * 100, as_torch=True)
    nbytes = encode(MessageType.TRAJECTORIES, body, sender=0, seq=0).nbytes
    buf = np.zeros(nbytes, dtype=np.uint8)

    def ours():
        if world.rank == 0:
            for _ in range(messages):
                channel.isend(MessageType.TRAJECTORIES, body, 1)
            channel.drain()
        else:
            for _ in range(messages):
                msg = channel.recv(0, timeout=60)
                assert msg.body["states"].shape[0] == BASE_BATCH * 100
        world.Barrier()

    def baseline():
        if world.rank == 0:
            for _ in range(messages):
                raw.Send([buf, MPI.BYTE], 1, 0)
        else:
            for _ in range(messages):
                raw.Recv([buf, MPI.BYTE], 0, 0)
        world.Barrier()

    samples: dict[str, list[float]] = {"gflowdist": [], "raw": []}
    ours(), baseline()  # warm up
    for _ in range(rounds):
        for name, fn in (("gflowdist", ours), ("raw", baseline)):
            world.Barrier()
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) / messages)
    if world.rank == 0:
        result = {name: statistics.median(v) for name, v in samples.items()}
        result["bytes"] = nbytes
        print("RESULT " + json.dumps(result), flush=True)


def e2e_table(messages: int, rounds: int) -> str:
    r = run_mpi_workers(__file__, ["--messages", str(messages), "--rounds", str(rounds)])
    mb = r["bytes"] / 1e6
    ours, raw = mb / r["gflowdist"], mb / r["raw"]
    return (
        f"\nend to end over 2 MPI ranks, 100x torch batch ({r['bytes']:,} bytes per message), wall time:\n"
        f"| path | per message | MB/s | % of raw |\n|---|---|---|---|\n"
        f"| raw mpi4py Send/Recv (preallocated) | {_format_time(r['raw'])} | {raw:.0f} | 100% |\n"
        f"| gflowdist encode + send + recv + decode | {_format_time(r['gflowdist'])} | {ours:.0f} | "
        f"{100 * ours / raw:.0f}% |\ntarget: >= 80% of raw: {'met' if ours >= 0.8 * raw else 'NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-e2e", action="store_true", help="skip the 2-rank end-to-end part")
    parser.add_argument("--worker", choices=["mpi"], help=argparse.SUPPRESS)
    parser.add_argument("--messages", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=7, help="repetitions per measurement (median, default 7)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repetition, at least (default 0.05)")
    parser.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="process CPU time (default) or wall time"
    )
    args = parser.parse_args(argv)
    if args.worker:
        e2e_worker(args.messages, args.rounds)
        return 0
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    timing = {"repeats": args.repeats, "min_time": args.min_time, "clock": clock}
    methods: list[tuple[str, Callable[[Any], Any]]] = [
        ("gflowdist", codec_roundtrip),
        ("gflowdist copy", lambda body: codec_roundtrip(body, copy=True)),
        ("pickle-5", pickle_inband),
        ("pickle-5 oob", pickle_out_of_band),
        ("torch.save", torch_save_load),
    ]
    print(
        f"torch {torch.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}; {args.clock} time, "
        f"median of {args.repeats} repetitions; ratio = pickle-5 / gflowdist\n"
    )
    header = ["payload", "batch", "bytes"] + [name for name, _ in methods] + ["ratio"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    slowest_ratio = float("inf")
    for as_torch in (True, False):
        for scale in SCALES:
            batch = BASE_BATCH * scale
            body = trajectory_batch(batch, as_torch=as_torch)
            _check_equal(body, codec_roundtrip(body))
            size = encode(MessageType.TRAJECTORIES, body, sender=0, seq=1).nbytes
            calls = {name: functools.partial(fn, body) for name, fn in methods if as_torch or name != "torch.save"}
            times = measure(calls, **timing)
            ratio = times["pickle-5"] / times["gflowdist"]
            slowest_ratio = min(slowest_ratio, ratio)
            cells = ["torch" if as_torch else "numpy", f"{batch} ({scale}x)", f"{size:,}"]
            cells += [_format_time(times[name]) if name in times else "n/a" for name, _ in methods]
            cells.append(f"{ratio:.2f}x")
            print("| " + " | ".join(cells) + " |")
    tiny = {"step": 3, "ok": True}
    tiny_buf = encode(MessageType.PING, tiny, sender=0, seq=1)
    tiny_times = measure(
        {
            "encode": lambda: encode(MessageType.PING, tiny, sender=0, seq=1),
            "decode": lambda: decode(tiny_buf, sender=0),
            "both": lambda: decode(encode(MessageType.PING, tiny, sender=0, seq=1), sender=0),
            "pickle": lambda: pickle_inband(tiny),
        },
        **timing,
    )
    print(
        f"\ntiny body {tiny} ({tiny_buf.nbytes} bytes): encode {_format_time(tiny_times['encode'])}, "
        f"decode {_format_time(tiny_times['decode'])}, encode+decode {_format_time(tiny_times['both'])} "
        f"(pickle-5 round trip {_format_time(tiny_times['pickle'])})"
    )
    verdict = "met" if slowest_ratio >= 1.0 else "NOT met"
    print(f"target 'at least as fast as pickle-5 in-band at every size': {verdict} (lowest ratio {slowest_ratio:.2f}x)")
    if not args.no_e2e:
        print(e2e_table(args.messages, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
