"""Recovery from a lost trainer with ``faults.max_restarts``, against the same job's own start-up.

    python benchmarks/restart.py            # 3 repeats, ~2 minutes on a quiet 2-core machine
    python benchmarks/restart.py --quick    # 1 repeat

The toy job (``tests/jobs/toy.yaml``: trainers 0-1, buffer 2, coordinator 3)
with ``faults.peer_timeout_s`` (default 3), ``heartbeat_s`` 0.2,
``checkpoint_every`` 5, ``max_restarts`` 1, ``restart_delay_s`` 0 and
``log_every`` 1. Per repeat, one ``gflowdist run``:

- **baseline, start-up**: seconds from starting ``gflowdist run`` to the
  first step (its first metrics row): what any launch costs;
- ``kill -9`` of trainer 1 once 15 steps are done, then seconds from the kill
  to: the launcher's ``lost rank 1`` line (**detection**, bounded below by
  ``peer_timeout_s``), its ``restart 1 of 1`` line, the first step of
  generation 1 (the first metrics row not there when the restart began); and **detection to the
  first step of the next generation**, the part a restart adds over a
  fresh start-up.

Then one more ``gflowdist run`` per repeat with an actor (5 ranks: trainers
0-1, actor 2, buffer 3, coordinator 4) and ``faults.on_actor_loss:
continue``: ``kill -9`` of the actor once trainer 1 has done 15 steps, the
seconds to the collector's ``going on without it`` line, and the metrics
rows (trainer steps) written meanwhile: the trainers do not wait for the
verdict.

Times are read on this host's clock: the launcher's lines as they arrive,
the metrics file polled every 20 ms. Medians over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "jobs" / "toy.yaml"


def _rows(metrics: Path) -> list[dict]:
    try:
        text = metrics.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip().endswith("}")]


class Launch:
    """``gflowdist run`` with every output line time-stamped as it arrives."""

    def __init__(self, out_dir: Path, peer_timeout: float, *extra: str):
        from gflowdist.jobenv import without_launcher

        self.out_dir = out_dir
        self.lines: list[tuple[float, str]] = []
        cmd = [
            sys.executable,
            "-m",
            "gflowdist",
            "run",
            str(TOY),
            f"run.out_dir={out_dir}",
            "run.steps=60",
            "run.log_every=1",
            "params.delay_s=0.05",
            f"faults.peer_timeout_s={peer_timeout}",
            "faults.heartbeat_s=0.2",
            *extra,
        ]
        env = dict(without_launcher(dict(os.environ)), PYTHONUNBUFFERED="1")
        self.started = time.time()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def when(self, text: str, deadline: float) -> float:
        while time.time() < deadline:
            for stamp, line in list(self.lines):
                if text in line:
                    return stamp
            time.sleep(0.02)
        raise RuntimeError(f"no line with {text!r}:\n" + "\n".join(line for _, line in self.lines))

    def run_dir(self, deadline: float) -> Path:
        while time.time() < deadline:
            found = [p for p in self.out_dir.glob("*/metrics.jsonl")]
            if found:
                return found[0].parent
            time.sleep(0.02)
        raise RuntimeError("no run directory")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _kill_after_15_steps(run: Path, rank: int) -> float:
    """Wait until trainer 1 has done 15 steps, ``kill -9`` rank ``rank``; returns when."""
    while len([r for r in _rows(run / "metrics.jsonl") if r["rank"] == 1]) < 15:
        time.sleep(0.02)
    log = (run / "logs" / f"rank-{rank}.log").read_text()
    os.kill(int(log.split(" pid ")[1].split()[0]), signal.SIGKILL)
    return time.time()


def one_repeat(out_dir: Path, peer_timeout: float) -> dict[str, float]:
    launch = Launch(
        out_dir, peer_timeout, "faults.checkpoint_every=5", "faults.max_restarts=1", "faults.restart_delay_s=0"
    )
    deadline = time.time() + 300
    try:
        run = launch.run_dir(deadline)
        metrics = run / "metrics.jsonl"
        while len(_rows(metrics)) < 1:
            time.sleep(0.02)
        first_step = time.time()
        killed = _kill_after_15_steps(run, 1)
        detected = launch.when("lost rank 1", deadline)
        restart = launch.when("restart 1 of 1", deadline)
        before = {json.dumps(r, sort_keys=True) for r in _rows(metrics)}  # generation 0 has ended
        while all(json.dumps(r, sort_keys=True) in before for r in _rows(metrics)):
            time.sleep(0.02)
        resumed = time.time()
        code = launch.proc.wait(timeout=max(1.0, deadline - time.time()))
        if code != 0:
            raise RuntimeError(f"the job exited {code}:\n" + "\n".join(line for _, line in launch.lines))
    finally:
        launch.stop()
    return {
        "start-up (launch -> first step)": first_step - launch.started,
        "kill -> detection (lost rank named)": detected - killed,
        "kill -> restart decided": restart - killed,
        "detection -> first step of generation 1": resumed - detected,
        "kill -> first step of generation 1": resumed - killed,
    }


def one_actor_loss(out_dir: Path, peer_timeout: float) -> dict[str, float]:
    """``faults.on_actor_loss: continue``: kill -9 of the actor (rank 2 of 5); the trainers go on."""
    launch = Launch(out_dir, peer_timeout, "-n", "5", "layout.actors=1", "faults.on_actor_loss=continue")
    deadline = time.time() + 300
    try:
        run = launch.run_dir(deadline)
        killed = _kill_after_15_steps(run, 2)
        steps_at_kill = len(_rows(run / "metrics.jsonl"))
        detected = launch.when("going on without it", deadline)
        steps_gap = len(_rows(run / "metrics.jsonl")) - steps_at_kill
        code = launch.proc.wait(timeout=max(1.0, deadline - time.time()))
        if code != 0:
            raise RuntimeError(f"the job exited {code}:\n" + "\n".join(line for _, line in launch.lines))
    finally:
        launch.stop()
    return {
        "actor: kill -> detection (going on without it)": detected - killed,
        "actor: trainer steps meanwhile (both, count)": float(steps_gap),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat")
    parser.add_argument("--repeats", type=int, help="default 3 (quick 1)")
    parser.add_argument("--peer-timeout", type=float, default=3.0, help="faults.peer_timeout_s (default 3)")
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gflowdist-restart-") as folder:
        results = [
            {
                **one_repeat(Path(folder) / f"r{k}", args.peer_timeout),
                **one_actor_loss(Path(folder) / f"a{k}", args.peer_timeout),
            }
            for k in range(repeats)
        ]
    print(
        f"kill -9 of a trainer (4 ranks, max_restarts 1), then of an actor (5 ranks, on_actor_loss "
        f"continue): toy job, peer_timeout_s {args.peer_timeout:g}, "
        f"{repeats} repeat(s), load average {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    width = max(len(k) for k in results[0])
    print(f"{'interval':<{width}}  median s   min s   max s")
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"{key:<{width}}  {statistics.median(values):8.2f} {min(values):7.2f} {max(values):7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
