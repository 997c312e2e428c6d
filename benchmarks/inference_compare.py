"""benchmarks/latency.py's inference column: actors with their own forward against one inference rank.

Both runs are ``examples/apex_cartpole`` with a policy whose forward pass
dominates an actor's step: a 3 x 512 MLP Q-network (``params.hidden=512``,
``params.layers=3``) on CartPole without simulated latency (a step costs
microseconds, the forward of 16 observations milliseconds), 16 environments
per actor, actors unpaced, at **equal rank counts** (N + 3 ranks):

- ``own forward``: N actors (``config.yaml``), each running its network;
- ``inference``: N - 1 actors and 1 inference rank (``config_inference.yaml``),
  which runs one forward for all the actors' requests.

**env steps/s**: the sum over the actors of (last - first reported
``env_steps``) / (the time between those reports), as for Ape-X.
``inference`` = the inference run's env steps/s / the own-forward run's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APEX = ROOT / "examples" / "apex_cartpole"

#: the policy whose forward dominates (a 3 x 512 MLP), 16 environments per actor (fewer round trips per step)
POLICY = ["params.hidden=512", "params.layers=3", "params.envs_per_actor=16"]


def run_one(name: str, actors: int, inference: int, steps: int, out_dir: Path, load1, child_env) -> dict:
    """One Ape-X run of ``actors`` actors (+ ``inference`` inference ranks); its actors' env steps/s."""
    config = APEX / ("config_inference.yaml" if inference else "config.yaml")
    ranks = actors + inference + 3
    cmd = [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(config),
        "-n",
        str(ranks),
        f"layout.actors={actors}",
        *([f"layout.inference={inference}"] if inference else []),
        f"run.steps={steps}",
        f"run.out_dir={out_dir}",
        f"run.name=latency-{name.replace(' ', '-')}",
        "run.log_every=10",
        "params.env_steps_per_update=null",
        "params.env_latency_s=0",
        "params.target_return=100000",
        f"sync.weights_to_coordinator_every={steps}",
        "params.eval_episodes=1",
        "replay.learner_batch=32",
        *POLICY,
    ]
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    run_dir = next(
        Path(line.split("run directory ", 1)[1].strip())
        for line in out.stdout.splitlines()
        if line.startswith("gflowdist: run directory ")
    )
    finals = json.loads((run_dir / "finals.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    actor_ranks = {int(rank) for rank, f in finals.items() if f["role"] == "actor"}
    served = next((f["inference"] for f in finals.values() if f["role"] == "inference"), None)
    return {
        "name": name,
        "ranks": ranks,
        "actors": actors,
        "env_per_s": _summed_rate(rows, actor_ranks, "env_steps"),
        "mean_batch": served["mean_batch"] if served else None,
        "delay_ms": served["delay_mean_ms"] if served else None,
        "forward_ms": served["forward_mean_ms"] if served else None,
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
        "run_dir": str(run_dir),
    }


def _summed_rate(rows: list[dict], ranks: set[int], field: str) -> float:
    total = 0.0
    for rank in ranks:
        mine = [row for row in rows if row["rank"] == rank and field in row]
        if len(mine) >= 2 and mine[-1]["time"] > mine[0]["time"]:
            total += (mine[-1][field] - mine[0][field]) / (mine[-1]["time"] - mine[0]["time"])
    return total


def run_pair(actors: int, steps: int, out_dir: Path, load1, child_env) -> list[dict]:
    """Own forward (``actors`` actors) then one inference rank (``actors - 1`` actors), equal rank counts."""
    own = run_one(f"own forward {actors}A", actors, 0, steps, out_dir, load1, child_env)
    central = run_one(f"inference {actors - 1}A+1I", actors - 1, 1, steps, out_dir, load1, child_env)
    return [own, central]


def inference_ratio(pair: list[dict]) -> float | None:
    own, central = pair
    return central["env_per_s"] / own["env_per_s"] if own["env_per_s"] else None


def table(pair: list[dict], table_lines, fmt, load_cell) -> list[str]:
    base = pair[0]["env_per_s"]
    rows = [
        [
            r["name"],
            str(r["ranks"]),
            fmt(r["env_per_s"], ",.0f"),
            fmt(r["env_per_s"] / base if base else None, ".2f", "x"),
            fmt(r["mean_batch"], ".1f"),
            fmt(r["delay_ms"], ".2f"),
            fmt(r["forward_ms"], ".2f"),
            fmt(r["wall_s"], ".0f"),
            load_cell(r["load"]),
        ]
        for r in pair
    ]
    head = ["setup", "ranks", "env steps/s", "vs own", "batch obs", "queue ms", "forward ms", "wall s", "load"]
    return table_lines(head, rows)
