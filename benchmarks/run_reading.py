"""What the benchmarks share: a child process's environment, the load average, a worker's RESULT line, and
what a finished ``gflowdist run`` left in its run directory (throughput, time to the L1 target, replay waits,
the start-up timeline), with the table cells that show them. Definitions: ``hypergrid.py``'s docstring."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

#: the HyperGrid window L1 (``hypergrid_gfn.l1_distance``) a run must reach: every trainer's, at one logged step
L1_TARGET = 0.5


def child_env(**extra: str) -> dict[str, str]:
    """This environment without an enclosing MPI job's variables, one thread per process."""
    from gflowdist.jobenv import without_launcher

    env = without_launcher(dict(os.environ))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    return env


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def parse_result(output: str) -> dict:
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"the worker printed no RESULT line:\n{output[-3000:]}")


def run_directory(stdout: str) -> Path:
    marker = "gflowdist: run directory "
    for line in stdout.splitlines():
        if line.startswith(marker):
            return Path(line[len(marker) :].strip())
    raise RuntimeError(f"gflowdist run printed no run directory:\n{stdout[-2000:]}")


def read_run(run_dir: Path, trainers: int, steps: int) -> dict:
    """traj/s, time to L1, step time and replay waits of a finished run directory."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    last = by_step[max(by_step)]
    if len(last) != trainers:
        raise RuntimeError(f"{run_dir}: the last metrics step has {len(last)} trainer lines, expected {trainers}")
    seconds = max(r["time"] for r in last)
    trajectories = sum(r["trajectories"] for r in last)
    l1 = [
        {"step": s, "time": max(r["time"] for r in rs), "l1": [r["l1"] for r in rs]}
        for s, rs in sorted(by_step.items())
        if len(rs) == trainers
    ]
    finals = json.loads((run_dir / "finals.json").read_text())
    step_s = seconds / steps
    waits = []
    for final in finals.values():
        if final["role"] == "trainer":
            phases = final["timing"]["phases"]
            waits.append(sum(phases.get("wait_replay", [])) / max(final["step"], 1))
    wait = statistics.fmean(waits)
    result = {
        "traj_per_s": trajectories / seconds,
        "seconds": seconds,
        "steps": steps,
        "step_ms": 1e3 * step_s,
        "wait_ms": 1e3 * wait,
        "wait_pct": 100 * wait / step_s,
        "first_step_time": min(r["time"] for r in by_step[min(by_step)]),
    }
    result.update(time_to_l1(l1))
    return result


def time_to_l1(l1_rows: list[dict]) -> dict:
    for row in l1_rows:
        if max(row["l1"]) <= L1_TARGET:
            return {"l1_time": row["time"], "l1_step": row["step"]}
    return {"l1_time": None, "l1_step": None}


def log_timestamps(run_dir: Path) -> list[float]:
    """Wall-clock time of the first line of every rank log (logging starts after the context exists)."""
    stamps = []
    for log in sorted((run_dir / "logs").glob("rank-*.log")):
        first = log.read_text().splitlines()[0]
        day, clock = first.split()[:2]
        whole, millis = clock.split(",")
        stamps.append(time.mktime(time.strptime(f"{day} {whole}", "%Y-%m-%d %H:%M:%S")) + int(millis) / 1e3)
    return stamps


def startup_timeline(run_dir: Path, launched: float) -> dict:
    """Seconds from launch to: every rank logging, training start, end of the first step."""
    training_start = (run_dir / "config.yaml").stat().st_mtime
    stamps = log_timestamps(run_dir)
    return {"ranks_up_s": max(stamps) - launched, "training_start_s": training_start - launched}


def first_step_s(result: dict) -> float:
    return result["training_start_s"] + result["first_step_time"]


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(values, spec: str) -> str:
    """``median`` or ``median (min-max)`` when there are several values."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(statistics.median(values), spec)} ({format(min(values), spec)}-{format(max(values), spec)})"
