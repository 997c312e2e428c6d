"""One buffer rank serving 1, 2 and 3 clients: inserts/s and samples/s vs the raw transport, in one run.

    python benchmarks/replay.py            # small and large items, 1-3 clients, ~1-2 minutes
    python benchmarks/replay.py --quick    # small items, 1 client, 1/10 of the messages: a smoke run

Launches itself under ``mpiexec -n C+1`` for C = 1, 2, 3 clients. The buffer
rank runs gflowdist's real buffer loop, ``gflowdist.runtime.loops.run_buffer``
(the default ``BufferManager``, a uniform ``ReplayBuffer``, the config's
channels); the clients speak its protocol on the DATA channel exactly as the
trainer loop does (``TRAJECTORIES`` bodies ``{batch, seq, version, n}``,
``SAMPLE_REQUEST`` ``{n, version}``, then ``CONTROL`` ``done``). Items:

- ``small``: HyperGrid-sized: states int64 [21, 2], actions int64 [20],
  log_rewards float32 (~0.5 KB); 16 per insert message and per sample;
- ``large``: the same plus observations float32 [512, 512] (~1 MiB a
  trajectory); 4 per insert message and per sample.

Phases, each from a barrier until the buffer loop returns (every client said
``done``), repeated ``--repeats`` times, medians reported:

- **insert**: every client ``isend``\\s its messages back to back (at most
  ``replay.max_in_flight`` = 8 in flight, as a trainer would); inserts/s =
  trajectories admitted / the buffer's wall time;
- **sample**: every client sends a request and waits for the reply, one at a
  time (a trainer with ``replay.prefetch=0``); samples/s = trajectories served
  / the buffer's wall time; **RTT** = the clients' mean time per request (the
  buffer round trip);
- **raw** (the ceiling, same bytes, same pattern): the clients send the
  encoded insert message with ``MPIComm.isend`` and the buffer only
  ``MPIComm.recv``\\s it; for samples the buffer answers each request with
  the encoded reply's bytes. No codec, no channel, no replay buffer.

``% raw`` = ours / raw. ``busy %``: the buffer's ``insert`` / ``sample``
phase time over its wall time (the rest is receiving, polling, sleeping).
``CPU us/traj``: the buffer process's CPU time in the phase per trajectory
(robust to other processes' load, unlike the rates).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from run_reading import child_env, load_average, parse_result  # the benchmarks' shared helpers

#: kind -> (trajectories per message, insert messages per client, sample requests per client, capacity)
KINDS = {"small": (16, 400, 400, 10_000), "large": (4, 25, 25, 256)}
RAW_TAG = 7


def make_batch(kind: str, n: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    batch = {
        "states": torch.randint(0, 8, (n, 21, 2), generator=g),
        "actions": torch.randint(0, 3, (n, 20), generator=g),
        "log_rewards": torch.randn(n, generator=g),
    }
    if kind == "large":
        batch["observations"] = torch.randn(n, 512, 512, generator=g)
    return batch


class Harness:
    """The buffer rank's loop and the clients' side of its protocol, on one MPI world."""

    def __init__(self, kind: str, scale: float):
        import torch

        from gflowdist.config import Config
        from gflowdist.context import DistributedContext
        from gflowdist.layout import Role
        from gflowdist.runtime.roles import BufferManager
        from gflowdist.runtime.wiring import StopFlag, Wiring

        torch.set_num_threads(1)
        self.kind = kind
        per_msg, inserts, samples, capacity = KINDS[kind]
        self.per_msg = per_msg
        self.inserts = max(2, round(inserts * scale))
        self.samples = max(2, round(samples * scale))
        self.config = Config.from_dict(
            {
                "layout": {"trainers": "rest", "buffers": 1, "coordinator": False},
                "replay": {"capacity": capacity},
                "faults": {"heartbeat_s": 1.0, "peer_timeout_s": 600.0, "preempt_grace_s": 601.0},
            }
        )
        self.ctx = DistributedContext.create(self.config.layout)
        self.world = self.ctx.world
        self.w = Wiring.build(self.ctx, self.config, StopFlag())
        self.is_buffer = self.ctx.role is Role.BUFFER
        self.buffer = self.ctx.layout.buffers[0]
        self.clients = len(self.ctx.layout.for_rank(self.buffer).clients)
        self.batch = make_batch(kind, per_msg, self.world.rank)
        if self.is_buffer:
            generator = torch.Generator().manual_seed(0)
            self.manager = BufferManager(
                rank=self.world.rank, config=self.config, generator=generator, context=self.ctx
            )
            self.replay = self.manager.make_buffer()

    # -- one phase ----------------------------------------------------------------------------
    def phase(self, name: str) -> dict:
        """Run one phase on every rank; returns what the buffer and the clients measured."""
        self.world.barrier(timeout=120)
        start, cpu = time.perf_counter(), time.process_time()
        if self.is_buffer:
            before = self._busy()
            served = getattr(self, f"_serve_{name}")()
            wall = time.perf_counter() - start
            mine = {
                "wall": wall,
                "items": served,
                "busy": (self._busy() - before) / wall,
                "cpu": time.process_time() - cpu,
            }
        else:
            getattr(self, f"_client_{name}")()
            mine = {"client_wall": time.perf_counter() - start}
        if name.endswith("sample"):
            mine["per_request"] = (time.perf_counter() - start) / self.samples if not self.is_buffer else None
        gathered = [json.loads(b) for b in self.world.all_gather_bytes(json.dumps(mine).encode())]
        result = gathered[self.buffer]
        rtts = [g["per_request"] for g in gathered if g.get("per_request")]
        if rtts:
            result["rtt"] = statistics.fmean(rtts)
        return result

    def _busy(self) -> float:
        phases = self.w.timer.to_dict()["phases"]
        return sum(sum(phases.get(p, [])) for p in ("insert", "sample"))

    # -- gflowdist: the real buffer loop ---------------------------------------------------------
    def _serve_insert(self) -> int:
        from gflowdist.runtime.loops import run_buffer
        from gflowdist.runtime.state import BufferState

        before = self.w.ledger.admitted
        run_buffer(self.manager, self.w, BufferState(), self.replay)
        return self.w.ledger.admitted - before

    def _serve_sample(self) -> int:
        from gflowdist.runtime.loops import run_buffer
        from gflowdist.runtime.state import BufferState

        run_buffer(self.manager, self.w, BufferState(), self.replay)
        return self.clients * self.samples * self.per_msg

    def _client_insert(self) -> None:
        from gflowdist.runtime import protocol

        data = self.w.data
        for i in range(self.inserts):
            data.isend(*protocol.trajectories(self.batch, seq=i * self.per_msg, version=0, n=self.per_msg), self.buffer)
        data.send(*protocol.done(), self.buffer)
        data.drain()

    def _client_sample(self) -> None:
        from gflowdist.errors import GflowdistError
        from gflowdist.runtime import protocol

        data = self.w.data
        for _ in range(self.samples):
            data.isend(*protocol.sample_request(self.per_msg, 0), self.buffer)
            reply = data.recv(self.buffer, timeout=120)
            if reply.body.get("batch") is None:
                raise GflowdistError(f"the buffer could not sample {self.per_msg} items")
        data.send(*protocol.done(), self.buffer)
        data.drain()

    # -- raw: MPIComm send/recv of the same bytes --------------------------------------------------
    def _encoded(self, reply: bool):
        from gflowdist.runtime import protocol
        from gflowdist.transport.codec import encode

        if reply:
            return encode(*protocol.sample_reply(self.batch, self.batch["actions"][:, 0]), sender=self.buffer, seq=0)
        message = protocol.trajectories(self.batch, seq=0, version=0, n=self.per_msg)
        return encode(*message, sender=self.world.rank, seq=0)

    def _serve_raw_insert(self) -> int:
        for _ in range(self.clients * self.inserts):
            self.world.recv(None, RAW_TAG, timeout=120)
        return self.clients * self.inserts * self.per_msg

    def _client_raw_insert(self) -> None:
        payload = self._encoded(reply=False)
        pending: collections.deque = collections.deque()
        for _ in range(self.inserts):
            if len(pending) >= self.config.replay.max_in_flight:
                pending.popleft().wait(120)
            pending.append(self.world.isend(payload, self.buffer, RAW_TAG))
        for handle in pending:
            handle.wait(120)

    def _serve_raw_sample(self) -> int:
        payload = self._encoded(reply=True)
        handles = []
        for _ in range(self.clients * self.samples):
            sender, _ = self.world.recv(None, RAW_TAG, timeout=120)
            handles.append(self.world.isend(payload, sender, RAW_TAG))
        for handle in handles:
            handle.wait(120)
        return self.clients * self.samples * self.per_msg

    def _client_raw_sample(self) -> None:
        import numpy as np

        request = np.zeros(16, dtype=np.uint8)
        for _ in range(self.samples):
            self.world.send(request, self.buffer, RAW_TAG, timeout=120)
            self.world.recv(self.buffer, RAW_TAG, timeout=120)

    def finish(self) -> None:
        """Read what the buffer reported to the collector (rank 0) during the phases; clean up."""
        self.world.barrier(timeout=120)
        if self.world.rank == self.w.collector:
            while self.w.control.try_recv() is not None:
                pass
        self.w.data.drain()
        self.w.control.drain()
        self.ctx.cleanup()


def worker(kinds: list[str], repeats: int, scale: float) -> None:
    results = {}
    for kind in kinds:
        harness = Harness(kind, scale)
        runs = collections.defaultdict(list)
        for _ in range(repeats):
            for name in ("raw_insert", "insert", "raw_sample", "sample"):
                runs[name].append(harness.phase(name))
        harness.finish()
        results[kind] = {
            "clients": harness.clients,
            "per_msg": harness.per_msg,
            "bytes_insert": int(harness._encoded(reply=False).nbytes),
            "bytes_reply": int(harness._encoded(reply=True).nbytes),
            "phases": runs,
        }
    if harness.is_buffer:
        print("RESULT " + json.dumps(results), flush=True)


def run(clients: int, kinds: list[str], repeats: int, scale: float) -> dict:
    from gflowdist.jobenv import find_mpiexec

    cmd = [
        find_mpiexec(),
        "-n",
        str(clients + 1),
        sys.executable,
        __file__,
        "--worker",
        "--kinds",
        ",".join(kinds),
        "--repeats",
        str(repeats),
        "--scale",
        str(scale),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return parse_result(out.stdout)


def rate(phases: list[dict]) -> float:
    return statistics.median(p["items"] / p["wall"] for p in phases)


def rows_for(kind: str, result: dict) -> list[str]:
    phases = result["phases"]
    inserts, raw_inserts = rate(phases["insert"]), rate(phases["raw_insert"])
    samples, raw_samples = rate(phases["sample"]), rate(phases["raw_sample"])
    mb = result["bytes_insert"] / result["per_msg"] / 1e6  # MB per trajectory on the wire

    def cpu_us(name: str) -> str:
        return f"{statistics.median(p['cpu'] / p['items'] for p in phases[name]) * 1e6:,.0f}"

    return [
        kind,
        str(result["clients"]),
        f"{inserts:,.0f}",
        f"{inserts * mb:,.1f}",
        f"{raw_inserts:,.0f}",
        f"{100 * inserts / raw_inserts:.0f}%",
        f"{statistics.median(p['busy'] for p in phases['insert']) * 100:.0f}",
        f"{cpu_us('insert')} / {cpu_us('raw_insert')}",
        f"{samples:,.0f}",
        f"{raw_samples:,.0f}",
        f"{100 * samples / raw_samples:.0f}%",
        f"{cpu_us('sample')} / {cpu_us('raw_sample')}",
        f"{statistics.median(p['rtt'] for p in phases['sample']) * 1e3:.2f}",
        f"{statistics.median(p['rtt'] for p in phases['raw_sample']) * 1e3:.2f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small items, 1 client, 1/10 of the messages")
    parser.add_argument("--clients", help="comma list of client counts (default 1,2,3)")
    parser.add_argument("--repeats", type=int, help="repetitions of each phase (default 3, quick 1)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kinds", default="small,large", help="comma list of small, large")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the message counts")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; choose from {', '.join(KINDS)}")
    repeats = args.repeats or (1 if args.quick else 3)
    if args.worker:
        worker(kinds, repeats, args.scale)
        return 0
    if args.quick:
        kinds, scale = ["small"], 0.1 * args.scale
    else:
        scale = args.scale
    counts = [int(c) for c in (args.clients or ("1" if args.quick else "1,2,3")).split(",")]
    began = time.monotonic()
    loads = [os.getloadavg()[0]]
    rows = []
    for clients in counts:
        result = run(clients, kinds, repeats, scale)
        loads.append(os.getloadavg()[0])
        rows.extend(rows_for(kind, result[kind]) for kind in kinds)
    rows.sort(key=lambda r: (kinds.index(r[0]), int(r[1])))
    from gflowdist.timing.text_table import table_lines

    print(
        f"one buffer rank (gflowdist run_buffer) vs raw MPIComm, per message: small 16, large 4 trajectories; "
        f"median of {repeats}; {load_average()}; 1-min load during the runs {min(loads):.2f}-{max(loads):.2f}; "
        f"{time.monotonic() - began:.0f} s"
    )
    headers = [
        "items",
        "clients",
        "inserts/s",
        "MB/s",
        "raw traj/s",
        "% raw",
        "busy %",
        "CPU us/traj (raw)",
        "samples/s",
        "raw traj/s",
        "% raw",
        "CPU us/traj (raw)",
        "RTT ms",
        "raw RTT ms",
    ]
    print("\n".join(table_lines(headers, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
