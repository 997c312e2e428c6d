"""What benchmarks/latency.py reads of a finished ``gflowdist run`` of environment actors: its rates, its target,
where each role's time went (from the run directory), and the load average beside each figure."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from inference_compare import summed_rate
from run_reading import child_env, run_directory

__all__ = ["load1", "metric_rows", "run_env_job", "where_time_goes"]


def load1() -> float:
    return os.getloadavg()[0]


def run_env_job(name: str, actors: int, cmd: list[str], timeout: float) -> dict:
    """Run ``cmd`` (a ``gflowdist run`` of environment actors) and read its rates from its run directory."""
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    run_dir = run_directory(out.stdout)
    finals = json.loads((run_dir / "finals.json").read_text())
    summary = next(f["summary"] for f in finals.values() if f["role"] == "coordinator")
    rows = metric_rows(run_dir)
    actor_ranks = {int(rank) for rank, f in finals.items() if f["role"] == "actor"}
    return {
        "name": name,
        "actors": actors,
        "env_per_s": summed_rate(rows, actor_ranks, "env_steps"),
        "wait_pct": 100 * summed_rate(rows, actor_ranks, "env_wait_s") / max(len(actor_ranks), 1),
        "time_to_target": summary["solved_at"]["seconds"] if summary["solved_at"] else None,
        "learner_steps": max((p["learner_steps"] for p in summary["curve"]), default=0),
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
        "where": where_time_goes(finals),
        "run_dir": str(run_dir),
    }


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def where_time_goes(finals: dict) -> dict[str, dict[str, float]]:
    """Per role: the share (%) of its timed phases' seconds each phase took (the run's finals.json)."""
    out: dict[str, dict[str, list[float]]] = {}
    for final in finals.values():
        phases = final.get("timing", {}).get("phases", {})
        seconds = {name: float(sum(v)) if isinstance(v, list) else float(v) for name, v in phases.items()}
        total = sum(seconds.values())
        if total <= 0:
            continue
        role = out.setdefault(final["role"], {})
        for name, value in seconds.items():
            role.setdefault(name, []).append(100 * value / total)
    return {role: {name: sum(v) / len(v) for name, v in shares.items()} for role, shares in out.items()}
