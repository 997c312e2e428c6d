"""benchmarks/latency.py's inference column: actors with their own forward against one inference rank.

Both runs are ``examples/apex_cartpole`` with a policy whose forward pass
dominates an actor's step: an MLP Q-network of 3 hidden layers
(``params.layers=3``) of :data:`HIDDEN` units, 1024 first (the summary's),
then 512, on CartPole without simulated latency, 16 environments per actor,
actors unpaced, at **equal rank counts** (N + 3 ranks):

- ``own forward``: N actors (``config.yaml``), each running its network (to act,
  and three forwards per transition for its initial priorities, as Ape-X);
- ``inference``: N - 1 actors and 1 inference rank (``config_inference.yaml``),
  which runs one forward for all the actors' requests (items enter the buffer
  with the largest priority: the actors hold no weights); once with
  ``inference.split: 1`` (an actor asks for all 16 environments and waits: the
  actor and the inference rank take turns: the default) and, at the first
  size, once with ``inference.split: 2`` (each half's request is in flight
  while the actor steps the other half).

How much of an own-forward actor's work the network is, one process, CPU
time per env step (``ApexActor.collect`` + ``initial_priorities``, 2026-11-29):
29 us with a 1-unit network (the environments, the n-step transitions), 82 us
at 3 x 512 (65 % the network), 236 us at 3 x 1024 (88 %).

**env steps/s**: the sum over the actors of (last - first reported
``env_steps``) / (the time between those reports), as for Ape-X.
``inference`` = the default-split (1) inference run's env steps/s / the own-forward
run's, at the first size. Where the time goes, from finals.json: ``actor wait`` = the actors' time
waiting on the inference rank / their timed time, ``inf idle`` = the inference
rank's idle time / its timed time; ``cpu ms/1k`` = the CPU milliseconds the
actors and inference ranks used in their loops (``loop_cpu_s`` in finals.json,
the loop thread's) per 1,000 env steps: what acting costs, less sensitive to
the machine's load than a rate.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gflowdist.config.sections import InferenceConfig

ROOT = Path(__file__).resolve().parents[1]
APEX = ROOT / "examples" / "apex_cartpole"

#: the hidden layers' widths of the policies compared (3 layers each); the first is the summary's
HIDDEN = (1024, 512)
#: the inference runs' inference.split at the first width (the summary's ratio is the default split's)
SPLITS = (1, 2)
DEFAULT_SPLIT = InferenceConfig().split


def policy(hidden: int) -> list[str]:
    """The overrides of a 3 x ``hidden`` MLP policy with 16 environments per actor (fewer round trips per step)."""
    return [f"params.hidden={hidden}", "params.layers=3", "params.envs_per_actor=16"]


def run_one(
    name: str,
    actors: int,
    inference: int,
    steps: int,
    out_dir: Path,
    load1,
    child_env,
    split: int = 1,
    extra: tuple[str, ...] = (),
    hidden: int = HIDDEN[0],
) -> dict:
    """One Ape-X run of ``actors`` actors (+ ``inference`` inference ranks, ``split``) with a 3 x ``hidden``
    policy; its actors' env steps/s."""
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
        *([f"layout.inference={inference}", f"inference.split={split}"] if inference else []),
        f"run.steps={steps}",
        f"run.out_dir={out_dir}",
        f"run.name=latency-{name.replace(' ', '-')}",
        # an actor reports every run.log_every rollouts, and its rate needs two reports: short runs report more often
        f"run.log_every={max(1, min(10, steps // 20))}",
        "params.env_steps_per_update=null",
        "params.env_latency_s=0",
        "params.target_return=100000",
        f"sync.weights_to_coordinator_every={steps}",
        "params.eval_episodes=1",
        "replay.learner_batch=32",
        *policy(hidden),
        *extra,
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
        "hidden": hidden,
        "ranks": ranks,
        "actors": actors,
        "env_per_s": summed_rate(rows, actor_ranks, "env_steps"),
        "mean_batch": served["mean_batch"] if served else None,
        "delay_ms": served["delay_mean_ms"] if served else None,
        "forward_ms": served["forward_mean_ms"] if served else None,
        "closed_by": served["closed_by"] if served else None,
        "split": split if inference else None,
        "actor_wait": _wait_share(finals) if served else None,
        "cpu_ms_per_1k": _cpu_per_steps(finals, rows),
        "inference_idle": _idle_share(finals) if served else None,
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
        "run_dir": str(run_dir),
    }


def _timed_s(final: dict) -> float:
    return sum(sum(durations) for durations in final["timing"]["phases"].values())


def _cpu_per_steps(finals: dict, rows: list[dict]) -> float | None:
    """CPU milliseconds the acting ranks (actors and inference ranks) used in their loops per 1,000 env steps."""
    acting = [f for f in finals.values() if f["role"] in ("actor", "inference")]
    steps = sum(
        max((row["env_steps"] for row in rows if row["rank"] == int(rank) and "env_steps" in row), default=0)
        for rank, f in finals.items()
        if f["role"] == "actor"
    )
    if not steps or not all("loop_cpu_s" in f for f in acting):
        return None
    return 1e6 * sum(f["loop_cpu_s"] for f in acting) / steps


def _wait_share(finals: dict) -> float:
    """The actors' mean share of their timed time spent waiting on their inference rank."""
    shares = []
    for final in finals.values():
        if final["role"] == "actor" and _timed_s(final):
            waited = sum(w.get("inference", 0.0) for w in final["timing"]["waits"].values())
            shares.append(waited / _timed_s(final))
    return statistics.fmean(shares) if shares else 0.0


def _idle_share(finals: dict) -> float:
    """The inference ranks' mean share of their timed time spent idle (no request to serve)."""
    shares = [
        sum(f["timing"]["phases"].get("idle", [])) / _timed_s(f)
        for f in finals.values()
        if f["role"] == "inference" and _timed_s(f)
    ]
    return statistics.fmean(shares) if shares else 0.0


def summed_rate(rows: list[dict], ranks: set[int], field: str) -> float:
    """Sum over ``ranks`` of (last - first ``field``) / (their time apart), from metrics rows."""
    total = 0.0
    for rank in ranks:
        mine = [row for row in rows if row["rank"] == rank and field in row]
        if len(mine) >= 2 and mine[-1]["time"] > mine[0]["time"]:
            total += (mine[-1][field] - mine[0][field]) / (mine[-1]["time"] - mine[0]["time"])
    return total


def run_pair(actors: int, steps: int, out_dir: Path, load1, child_env, hidden=HIDDEN) -> list[dict]:
    """Per width in ``hidden``: own forward (``actors`` actors), then one inference rank (``actors - 1``
    actors), at each of :data:`SPLITS` for the first width and at the default split for the others: equal
    rank counts."""
    runs = []
    for index, width in enumerate(hidden):
        runs.append(
            run_one(f"own forward {actors}A 3x{width}", actors, 0, steps, out_dir, load1, child_env, hidden=width)
        )
        for split in SPLITS if index == 0 else (DEFAULT_SPLIT,):
            name = f"inference {actors - 1}A+1I split {split} 3x{width}"
            runs.append(run_one(name, actors - 1, 1, steps, out_dir, load1, child_env, split, hidden=width))
    return runs


def inference_ratio(runs: list[dict]) -> float | None:
    """At the first width: the default split's env steps/s over the own-forward run's (the last run's of that
    width when none has it)."""
    own = runs[0]
    same = [r for r in runs[1:] if r.get("hidden") == own.get("hidden")]  # summary rows may carry neither key
    central = next((r for r in same if r.get("split") == DEFAULT_SPLIT), same[-1])
    return central["env_per_s"] / own["env_per_s"] if own["env_per_s"] else None


def table(runs: list[dict], table_lines, fmt, load_cell) -> list[str]:
    """One row per run; ``vs own`` against the own-forward run of the same width."""
    own = {r["hidden"]: r["env_per_s"] for r in runs if r["split"] is None}
    rows = [
        [
            r["name"],
            str(r["ranks"]),
            fmt(r["env_per_s"], ",.0f"),
            fmt(r["env_per_s"] / own[r["hidden"]] if own[r["hidden"]] else None, ".2f", "x"),
            fmt(r["mean_batch"], ".1f"),
            fmt(r["delay_ms"], ".2f"),
            fmt(r["forward_ms"], ".2f"),
            fmt(100 * r["actor_wait"] if r.get("actor_wait") is not None else None, ".0f", "%"),
            fmt(100 * r["inference_idle"] if r.get("inference_idle") is not None else None, ".0f", "%"),
            fmt(r.get("cpu_ms_per_1k"), ".0f"),
            fmt(r["wall_s"], ".0f"),
            load_cell(r["load"]),
        ]
        for r in runs
    ]
    head = [
        "setup",
        "ranks",
        "env steps/s",
        "vs own",
        "batch obs",
        "queue ms",
        "forward ms",
        "actor wait",
        "inf idle",
        "cpu ms/1k",
        "wall s",
        "load",
    ]
    return table_lines(head, rows)
