"""Ape-X DQN on CartPole-v1 under gflowdist vs the single-process DQN: env steps/s, time to the return.

    python benchmarks/apex_cartpole.py              # 3 variants x 3 seeds: ~10 min on 2 idle cores, more loaded
    python benchmarks/apex_cartpole.py --quick      # 300 learner steps per variant, target unreachable: seconds

Variants, each with examples/apex_cartpole/config.yaml's hyper-parameters
(network, lr, batch, n-step, gamma, target update, PER alpha/beta, replay
size, epsilon ladder, evaluation every 500 learner steps on 10 greedy
episodes, target return 475) and the same seeds:

- ``single process``: ``examples/apex_cartpole/single_process.py``: one
  process steps all 8 environments (2 actors x 4, the same epsilon ladder),
  keeps a local prioritized buffer and alternates acting and learning at
  ``params.env_steps_per_update`` (16) environment steps per learner step;
- ``Ape-X``: ``gflowdist run examples/apex_cartpole/config.yaml``: 5 ranks (2
  actors, 1 buffer, 1 learner, 1 coordinator); the actors pace themselves to
  the same 16 environment steps per learner step (gflowdist.rl.env_actor);
- ``Ape-X unpaced``: the same with ``params.env_steps_per_update=null``: the
  actors run flat out, as in the Ape-X paper.

Definitions (medians over the seeds, with (min-max); variants interleaved so
load drift hits each alike):

- **time to 475**: seconds from the start of training (single process: after
  the environments and networks are built; Ape-X: the coordinator's first
  loop pass after every rank's setup) to the first evaluation whose mean
  return over 10 greedy episodes is >= 475. **env steps**, **learner steps**:
  counted at that evaluation (Ape-X: the actors' last reported counts, which
  lag by at most ``run.log_every`` rollouts each).
- **env steps/s**, **learner steps/s**: those counts / time to 475.
- **vs single**: time to 475 of the single process / this variant's (above 1:
  faster), of the medians.
- **wall s**: the whole command, start-up and shutdown included.

Runs that do not reach 475 within ``run.steps`` (20,000 learner steps) count
as not solved and are left out of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gflowdist.timing.text_table import table_lines
from run_reading import child_env, load_average, run_directory, spread

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "apex_cartpole"
CONFIG = EXAMPLE / "config.yaml"
#: variant -> overrides of config.yaml (None: the single-process baseline)
VARIANTS: dict[str, list[str] | None] = {
    "single process": None,
    "Ape-X": [],
    "Ape-X unpaced": ["params.env_steps_per_update=null"],
}
QUICK = [
    "run.steps=300",
    "sync.weights_to_coordinator_every=100",
    "params.target_return=100000",
    "params.eval_episodes=2",
]


def run_single(seed: int, extra: list[str], out_dir: Path) -> dict:
    result_file = out_dir / f"single-{seed}-{time.time_ns()}.json"
    cmd = [
        sys.executable,
        str(EXAMPLE / "single_process.py"),
        str(CONFIG),
        f"run.seed={seed}",
        *extra,
        "--json",
        str(result_file),
    ]
    began = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=child_env())
    if not result_file.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    result = json.loads(result_file.read_text())
    result["wall_s"] = time.monotonic() - began
    result["solved_at"] = next((p for p in result["curve"] if p["eval_return"] >= target(extra)), None)
    return result


def run_apex(seed: int, overrides: list[str], extra: list[str], out_dir: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(CONFIG),
        f"run.seed={seed}",
        f"run.out_dir={out_dir}",
        *overrides,
        *extra,
    ]
    began = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    run_dir = run_directory(out.stdout)
    finals = json.loads((run_dir / "finals.json").read_text())
    summary = next(f["summary"] for f in finals.values() if f["role"] == "coordinator")
    return {
        "wall_s": time.monotonic() - began,
        "curve": summary["curve"],
        "solved_at": summary["solved_at"],
        "run_dir": str(run_dir),
    }


def target(extra: list[str]) -> float:
    values = [float(o.split("=", 1)[1]) for o in extra if o.startswith("params.target_return=")]
    return values[-1] if values else 475.0


def rates(result: dict) -> dict:
    """Time, steps and rates at the solving evaluation (or the last one, for unsolved quick runs)."""
    point = result["solved_at"] or (result["curve"][-1] if result["curve"] else None)
    if point is None or point["seconds"] <= 0:
        return {}
    return {
        "seconds": point["seconds"],
        "env_steps": point["env_steps"],
        "learner_steps": point["learner_steps"],
        "env_per_s": point["env_steps"] / point["seconds"],
        "learner_per_s": point["learner_steps"] / point["seconds"],
    }


def table(results: dict[str, list[dict]]) -> list[str]:
    single = [rates(r)["seconds"] for r in results.get("single process", []) if r["solved_at"]]
    reference = statistics.median(single) if single else None
    rows = []
    for name, runs in results.items():
        measured = [rates(r) for r in runs if r["solved_at"]] or [rates(r) for r in runs if rates(r)]
        seconds = [m["seconds"] for m in measured]
        ratio = (
            f"{reference / statistics.median(seconds):.2f}x"
            if reference and seconds and any(r["solved_at"] for r in runs)
            else "-"
        )
        rows.append(
            [
                name,
                f"{sum(1 for r in runs if r['solved_at'])}/{len(runs)}",
                spread(seconds, ".1f"),
                spread([m["env_steps"] for m in measured], ",.0f"),
                spread([m["learner_steps"] for m in measured], ",.0f"),
                spread([m["env_per_s"] for m in measured], ",.0f"),
                spread([m["learner_per_s"] for m in measured], ",.0f"),
                ratio,
                spread([r["wall_s"] for r in runs], ".1f"),
            ]
        )
    head = [
        "variant",
        "solved",
        "time to 475 s",
        "env steps",
        "learner steps",
        "env steps/s",
        "learner steps/s",
        "vs single",
        "wall s",
    ]
    return table_lines(head, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300 learner steps, 1 seed, target unreachable")
    parser.add_argument("--seeds", help="comma list of run seeds (default 0,1,2; quick 0)")
    parser.add_argument("--variants", help=f"comma list of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--out-dir", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    extra = QUICK if args.quick else []
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-apex-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    began, first_load = time.monotonic(), os.getloadavg()[0]
    results, loads = run_variants(names, seeds, extra, out_dir)
    print(
        f"CartPole-v1 Ape-X DQN vs single process, seeds {seeds} (median, (min-max)); {load_average()}; "
        f"1-min load during the runs {min([*loads, first_load]):.2f}-{max([*loads, first_load]):.2f}; "
        f"{time.monotonic() - began:.0f} s"
    )
    print("\n".join(table(results)))
    print(f"run directories under {out_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def run_variants(
    names: list[str], seeds: list[int], extra: list[str], out_dir: Path
) -> tuple[dict[str, list[dict]], list[float]]:
    """Every variant once per seed, interleaved; the results by variant and the 1-min load after each run."""
    results: dict[str, list[dict]] = {name: [] for name in names}
    loads = []
    for seed in seeds:
        for name in names:
            overrides = VARIANTS[name]
            result = (
                run_single(seed, extra, out_dir) if overrides is None else run_apex(seed, overrides, extra, out_dir)
            )
            results[name].append({"seed": seed, **result})
            loads.append(os.getloadavg()[0])
            print(
                f"  {name} seed {seed}: {'solved' if result['solved_at'] else 'not solved'} "
                f"{json.dumps(rates(result))}",
                flush=True,
            )
    return results, loads


if __name__ == "__main__":
    sys.exit(main())
