"""A lost actor replaced (``faults.on_actor_loss: replace``): kill -9 to its replacement's first batch, and
the throughput in a window after the replacement against the same window before the kill.

    python benchmarks/replace.py                 # 1 repeat of each setup, 20 s windows: ~3 minutes on a quiet 2-core machine
    python benchmarks/replace.py --window 60 --repeats 3
    python benchmarks/replace.py --quick         # 5 s windows, 200 messages in the routes table: a smoke run

The toy job (``tests/jobs/toy.yaml`` with ``-n 5``: trainers 0-1, actor 2, buffer 3, coordinator 4;
``params.delay_s`` 0.03: each rollout sleeps up to 30 ms, waiting as a slow environment does; ``log_every`` 1,
``params.actor_metrics``: the actor writes a metrics row after each batch it ships, with its trajectory count),
``faults.peer_timeout_s`` 3, ``heartbeat_s`` 0.2, ``max_restarts`` 1. Once the actor has run for a window,
``kill -9`` of it; the spare actor the job spawned at start-up (``MPI_Comm_spawn``) takes its place; a window after
its first metrics row, SIGTERM to ``gflowdist run`` (a clean stop) and the run's ledger must balance with rank 2
named replaced. Two setups, each run in every repeat:

- **actor-bound** (``params.admit_delay_s`` 0): the buffer admits a batch at once, so the actor's rate is its own
  (rollout, ship); the actor's after/before ratio is the throughput the lost actor took with it, back;
- **buffer-bound** (``params.admit_delay_s`` 0.03): the buffer also sleeps up to 30 ms per admitted batch and is
  about 97% busy, so the job's rate is the buffer's and the actor's share is the buffer's order of service: it takes
  the world's senders in their order of arrival, but a routed peer (the replacement) and the world in turn, so
  the replacement gets a smaller share than the lost actor had and the trainers a larger one. Here the job's
  ratio is the one that says whether the throughput recovered.

Every time is on this host's clock, from polling ``metrics.jsonl`` every 20 ms:

- **kill to detection**: to the launcher's line ``lost rank 2 ... going on without it``;
- **kill to the replacement's first batch**: to its first metrics row, which the actor sends right after its
  first batch (the batch is on its way to the buffer; the buffer admits it within milliseconds on one host);
- **actor trajectories/s**, before (the window up to the kill) and after (the window from the replacement's
  first row), and their ratio: the throughput the lost actor took with it, back;
- **job trajectories/s** (trainers' and actor's rows together) over the same windows, and the ratio: the
  baseline is the window before the kill, in the same run.

Then the cost of the path itself (:mod:`routes`, in the same command): a message to a process reached through
the spares' intercommunicator against one over the world, round trips and streams, same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import routes  # a sibling benchmark

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "jobs" / "toy.yaml"
ARGS = [
    "-n",
    "5",
    "layout.actors=1",
    "run.steps=1000000",
    "run.log_every=1",
    "params.delay_s=0.03",
    "params.actor_metrics=1",
    "faults.heartbeat_s=0.2",
    "faults.peer_timeout_s=3",
    "faults.on_actor_loss=replace",
    "faults.max_restarts=1",
]

#: setup name -> the buffer's per-batch sleep, at most (``params.admit_delay_s``; module docstring)
SETUPS = {"actor-bound": 0.0, "buffer-bound": 0.03}


class Rows:
    """Every whole metrics row, each with the host time it was first seen."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rows = path, 0, []

    def poll(self) -> None:
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
        except FileNotFoundError:
            return
        whole = text[: text.rfind("\n") + 1]
        self.offset += len(whole.encode())
        now = time.time()
        self.rows += [(now, json.loads(line)) for line in whole.splitlines() if line.strip()]

    def actor(self) -> list[tuple[float, int]]:
        return [(t, r["trajectories"]) for t, r in self.rows if r["rank"] == 2 and "trajectories" in r]


def _rate(points: list[tuple[float, int]], start: float, end: float) -> float:
    """Trajectories per second from cumulative counts in ``[start, end]`` (first to last point inside)."""
    inside = [(t, n) for t, n in points if start <= t <= end]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def _job_rate(rows: Rows, start: float, end: float, restart: float | None = None) -> float:
    """All producers' trajectories per second in ``[start, end]`` (each rank's counts; the actor's from
    ``restart`` on, when given: its replacement counts from zero)."""
    total = 0.0
    for rank in {r["rank"] for _, r in rows.rows}:
        points = [(t, r["trajectories"]) for t, r in rows.rows if r["rank"] == rank and "trajectories" in r]
        if rank == 2 and restart is not None:
            points = [(t, n) for t, n in points if t >= restart]
        rate = _rate(points, start, end)
        total += 0.0 if rate != rate else rate
    return total


def measure(out_dir: Path, window: float, admit_delay_s: float = 0.0) -> dict:
    from gflowdist.jobenv import without_launcher

    log = out_dir / "launcher.log"
    cmd = [sys.executable, "-m", "gflowdist", "run", str(TOY), f"run.out_dir={out_dir / 'runs'}", *ARGS]
    cmd.append(f"params.admit_delay_s={admit_delay_s}")
    env = dict(without_launcher(dict(os.environ)), PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return _measure(proc, out_dir, log, window)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait(proc: subprocess.Popen, what: str, ready, timeout: float = 600) -> None:
    deadline = time.time() + timeout
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended ({proc.returncode}) before {what}")
        if time.time() > deadline:
            raise RuntimeError(f"no {what} within {timeout:g} s")
        time.sleep(0.02)


def _measure(proc: subprocess.Popen, out_dir: Path, log: Path, window: float) -> dict:
    _wait(proc, "run directory", lambda: list((out_dir / "runs").glob("*/metrics.jsonl")))
    run = next((out_dir / "runs").glob("*/metrics.jsonl")).parent
    rows = Rows(run / "metrics.jsonl")

    def actor_ran(span: float) -> bool:
        rows.poll()
        points = rows.actor()
        return len(points) > 2 and points[-1][0] - points[0][0] >= span

    _wait(proc, "a window of the actor's rows", lambda: actor_ran(window))
    pid = int((run / "logs" / "rank-2.log").read_text().split(" pid ")[1].split()[0])
    before = rows.actor()[-1][1]
    os.kill(pid, signal.SIGKILL)
    killed = time.time()
    detected = None

    def replacement_row() -> bool:
        nonlocal detected
        rows.poll()
        if detected is None and "going on without it" in log.read_text():
            detected = time.time()
        return any(t > killed and n <= before for t, n in rows.actor())

    _wait(proc, "the replacement's first row", replacement_row)
    first = next(t for t, n in rows.actor() if t > killed and n <= before)
    _wait(proc, "a window of the replacement's rows", lambda: (rows.poll(), time.time() >= first + window)[1])
    proc.send_signal(signal.SIGTERM)
    proc.wait(300)
    text = log.read_text()
    ledger = json.loads((run / "ledger.json").read_text())
    if not ledger.get("balanced") or "2" not in ledger.get("replaced_ranks", {}):
        raise RuntimeError(f"the ledger does not balance or does not name rank 2 replaced: {ledger}")
    old = [(t, n) for t, n in rows.actor() if t <= killed]
    new = [(t, n) for t, n in rows.actor() if t >= first]
    actor_before = _rate(old, killed - window, killed)
    actor_after = _rate(new, first, first + window)
    job_before = _job_rate(rows, killed - window, killed)
    job_after = _job_rate(rows, first, first + window, restart=first)
    match = re.search(r"replacing rank 2 \(actor on (\S+)\)", text)
    return {
        "host": match[1] if match else "?",
        "detect_s": (detected or float("nan")) - killed,
        "first_batch_s": first - killed,
        "actor_before": actor_before,
        "actor_after": actor_after,
        "job_before": job_before,
        "job_after": job_after,
        "exit": proc.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--window", type=float, default=20.0, help="seconds before the kill and after the first batch")
    parser.add_argument("--quick", action="store_true", help="one repeat, 5 s windows, 200 messages per route row")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.window = 1, 5.0
    start_load = os.getloadavg()
    results: dict[str, list[dict]] = {name: [] for name in SETUPS}
    for repeat in range(args.repeats):
        for name, admit_delay_s in SETUPS.items():
            with tempfile.TemporaryDirectory(prefix="gflowdist-replace-") as tmp:
                results[name].append(measure(Path(tmp), args.window, admit_delay_s))
            print(f"repeat {repeat + 1}, {name}: {results[name][-1]}", flush=True)
    load = os.getloadavg()
    print(
        f"\nload average {start_load[0]:.1f} at the start, {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end; "
        f"windows of {args.window:g} s; {args.repeats} run(s) of each setup"
    )
    print(f"{'measure':<52} {'median':>10} {'min':>10} {'max':>10}")

    def shown(value: float) -> str:
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"

    def row(name: str, values: list[float], unit: str = "") -> None:
        low, mid, high = (shown(v) for v in (min(values), statistics.median(values), max(values)))
        print(f"{name:<52} {mid:>10} {low:>10} {high:>10} {unit}".rstrip())

    for name, runs in results.items():
        print(f"{name} (params.admit_delay_s {SETUPS[name]:g})")
        row("  kill -9 to detection (s)", [r["detect_s"] for r in runs])
        row("  kill -9 to the replacement's first batch (s)", [r["first_batch_s"] for r in runs])
        row("  actor trajectories/s, window before the kill", [r["actor_before"] for r in runs])
        row("  actor trajectories/s, window after its first batch", [r["actor_after"] for r in runs])
        row("  actor after / before (target >= 0.95)", [r["actor_after"] / r["actor_before"] for r in runs], "x")
        row("  job trajectories/s, window before the kill", [r["job_before"] for r in runs])
        row("  job trajectories/s, window after", [r["job_after"] for r in runs])
        row("  job after / before (target >= 0.95)", [r["job_after"] / r["job_before"] for r in runs], "x")
    messages = 200 if args.quick else 2000
    print(f"\nthe routed path against the world ({messages} messages of each kind, benchmarks/routes.py):")
    print("\n".join(routes.table(routes.measure(messages))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
