"""SIGTERM to exit: the default toy job against the same job with 1,000,000 transitions in its buffer.

    python benchmarks/preemption.py            # 1 repeat of each, ~3 minutes on a quiet 2-core machine
    python benchmarks/preemption.py --repeats 3

The toy job (``tests/jobs/toy.yaml``: trainers 0-1, buffer 2, coordinator 3,
``params.delay_s`` 0.02, ``log_every`` 1), run until its buffer holds what
the case asks, then SIGTERM to ``gflowdist run`` (as Slurm's preemption or
``--signal`` sends it). Measured on this host's clock from the signal: the
final checkpoint intact (its manifest written: what ``faults.preempt_grace_s``
must cover), and the launcher's exit (the report and ledger after it).

- **baseline**: the default job, 16 trajectories a step, stopped at step 10
  (160 transitions in the buffer);
- **1M**: ``replay.capacity`` 1,000,000 and 8,192 transitions per trainer
  rollout, stopped once the buffer is full (step 62: 1,015,808 made).

The table gives each case's seconds and its ratio to the baseline; the
buffer's size and checkpoint part are read back from ``finals.json`` and the
manifest, so the table shows what was saved.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "jobs" / "toy.yaml"

CASES = {
    "baseline (default job)": (10, []),
    "1M transitions in the buffer": (62, ["replay.capacity=1000000", "params.n=8192"]),
}


def _steps(metrics: Path) -> int:
    try:
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip().endswith("}")]
    except FileNotFoundError:
        return 0
    return max((row["step"] + 1 for row in rows if row.get("rank") == 0 and "step" in row), default=0)


def measure(out_dir: Path, stop_at: int, extra: list[str]) -> dict:
    from gflowdist.jobenv import without_launcher

    cmd = [sys.executable, "-m", "gflowdist", "run", str(TOY), f"run.out_dir={out_dir}", "run.steps=100000"]
    cmd += ["run.log_every=1", "params.delay_s=0.02", *extra]
    env = dict(without_launcher(dict(os.environ)), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            runs = list(out_dir.glob("*/metrics.jsonl"))
            if runs and _steps(runs[0]) >= stop_at:
                break
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended early ({proc.returncode})")
            time.sleep(0.05)
        run = runs[0].parent
        proc.send_signal(signal.SIGTERM)
        signalled, saved = time.time(), None
        manifest = run / "checkpoints" / "gen-0000-final" / "MANIFEST.json"
        while proc.poll() is None and time.time() - signalled < 300:
            if saved is None and manifest.exists():
                saved = time.time() - signalled
            time.sleep(0.02)
        ended = time.time() - signalled
        finals = json.loads((run / "finals.json").read_text())
        files = json.loads(manifest.read_text())["files"]
        part = files.get("rank-00002.pt", {}).get("bytes")  # the buffer's part
        return {
            "code": proc.returncode,
            "size": finals["2"]["replay"]["size"],
            "part_bytes": part,
            "to_checkpoint_s": saved,
            "to_exit_s": ended,
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for k, (name, (stop_at, extra)) in enumerate(CASES.items()):
                results[name].append(measure(Path(tmp) / f"{repeat}-{k}", stop_at, extra))
    base = {
        key: statistics.median(r[key] for r in results[next(iter(CASES))]) for key in ("to_checkpoint_s", "to_exit_s")
    }
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}")
    print(f"{'case':30} {'buffer':>9} {'part MB':>8} {'to checkpoint':>14} {'to exit':>9} {'x base':>7} {'exit':>5}")
    for name, runs in results.items():
        ckpt = statistics.median(r["to_checkpoint_s"] for r in runs)
        ended = statistics.median(r["to_exit_s"] for r in runs)
        part = runs[-1]["part_bytes"]
        mb = f"{part / 1e6:.1f}" if part else "?"
        print(
            f"{name:30} {runs[-1]['size']:>9,} {mb:>8} {ckpt:>13.2f}s {ended:>8.2f}s "
            f"{ended / base['to_exit_s']:>6.2f}x {runs[-1]['code']:>5}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
