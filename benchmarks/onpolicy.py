"""On-policy examples under gflowdist vs a single process of the same algorithm: env steps and time to target.

    python benchmarks/onpolicy.py                 # every example x seeds 0,1,2 (~30 min on the loaded 2-core box)
    python benchmarks/onpolicy.py --quick         # a few updates per run, target unreachable: a smoke run
    python benchmarks/onpolicy.py --examples "PPO CartPole" --seeds 3,4,5

Examples, each with its config.yaml's hyper-parameters and the same seeds:

- ``PPO CartPole``: ``gflowdist run examples/ppo_cartpole/config.yaml``: DD-PPO,
  2 trainers that roll out 4 CartPoles each and average every minibatch's
  gradients, 1 coordinator evaluating 10 greedy episodes every 5 updates; target 475;
- ``PPO Pendulum``: ``examples/ppo_pendulum/config.yaml``: the same roles with a
  Gaussian policy; target -250 (mean action, 10 episodes);
- ``IMPALA CartPole``: ``examples/impala_cartpole/config.yaml`` when that example
  exists (with its ``single_process.py``).

Each against ``single_process.py`` of the same example directory run with the
same config and seed. PPO's plays every trainer of the DD-PPO run in one
process with that trainer's environments, random streams and minibatches, and
steps on the mean of their gradients: the same computation (bit-identical
with 2 trainers, tests/test_example_ppo.py), so its seeds are paired with the
job's. IMPALA's steps every actor's environments in one actor object and
learns from each batch at lag 0, as the example's on-policy queue
(``replay.max_staleness: 0``) makes the job do; its random streams differ
from the job's, so its seeds are not paired.

Definitions (medians over the seeds, (min-max)):

- **env steps**: environment steps of all processes up to the first evaluation
  that reaches the target (updates x the environments' steps per update: exact,
  not a report); **to target s**: seconds from the start of training to that
  evaluation; **env steps/s**: their ratio;
- **steps vs single**: median env steps of the distributed run / the single
  process's (the policy lag must not cost sample efficiency: target <= 1.3);
- **lag**: the policy-lag histogram of every item learned from, ``lag: items``
  (learner version - the version that produced the item): replayed items from
  the report's staleness, fresh items used by the trainer that produced them
  at lag 0.

Runs that do not reach the target within ``run.steps`` count as not solved and
are left out of the medians.
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
from collections import Counter
from pathlib import Path

from gflowdist.config import Config
from gflowdist.timing.text_table import table_lines
from run_reading import child_env, load_average, run_directory, spread

ROOT = Path(__file__).resolve().parents[1]
#: example -> (config, the single-process script that runs it)
EXAMPLES: dict[str, tuple[Path, Path]] = {
    "PPO CartPole": (ROOT / "examples/ppo_cartpole/config.yaml", ROOT / "examples/ppo_cartpole/single_process.py"),
    "PPO Pendulum": (ROOT / "examples/ppo_pendulum/config.yaml", ROOT / "examples/ppo_cartpole/single_process.py"),
    "IMPALA CartPole": (
        ROOT / "examples/impala_cartpole/config.yaml",
        ROOT / "examples/impala_cartpole/single_process.py",
    ),
}
QUICK = ["run.steps=4", "sync.weights_to_coordinator_every=2", "params.eval_episodes=1", "params.target_return=100000"]
#: the most the distributed run's env steps to the target may be of the single process's
TARGET_RATIO = 1.3


def available() -> list[str]:
    return [name for name, (config, script) in EXAMPLES.items() if config.exists() and script.exists()]


def run_single(name: str, seed: int, extra: list[str], out_dir: Path) -> dict:
    config, script = EXAMPLES[name]
    result_file = out_dir / f"single-{seed}-{time.time_ns()}.json"
    cmd = [sys.executable, str(script), str(config), f"run.seed={seed}", *extra, "--json", str(result_file)]
    began = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=child_env())
    if not result_file.exists():
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    result = json.loads(result_file.read_text())
    return {"wall_s": time.monotonic() - began, "curve": result["curve"], "solved_at": result["solved_at"], "lag": {}}


def run_distributed(name: str, seed: int, extra: list[str], out_dir: Path) -> dict:
    config, _ = EXAMPLES[name]
    cmd = [sys.executable, "-m", "gflowdist", "run", str(config), f"run.seed={seed}", f"run.out_dir={out_dir}", *extra]
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
        "lag": lag_histogram(finals),
        "run_dir": str(run_dir),
    }


def lag_histogram(finals: dict) -> dict[int, int]:
    """``{lag: items}`` over every trainer: its replayed items' staleness, its own fresh items at lag 0."""
    lags: Counter = Counter()
    for final in finals.values():
        if final["role"] != "trainer":
            continue
        lags[0] += int(final["ledger"].get("used_locally", 0))
        for lag, count in (final.get("staleness") or {}).items():
            lags[int(lag)] += int(count)
    return dict(sorted(lags.items()))


def measured(result: dict) -> dict:
    """Time, env steps and rate at the solving evaluation (or the last one, for unsolved quick runs)."""
    point = result["solved_at"] or (result["curve"][-1] if result["curve"] else None)
    if point is None or point["seconds"] <= 0:
        return {}
    return {"seconds": point["seconds"], "env_steps": point["env_steps"], "rate": point["env_steps"] / point["seconds"]}


def lag_text(histograms: list[dict]) -> str:
    total: Counter = Counter()
    for h in histograms:
        total.update({int(k): v for k, v in h.items()})
    if not total:
        return "-"
    return " ".join(f"{lag}:{count:,}" for lag, count in sorted(total.items()))


def table(results: dict[str, dict[str, list[dict]]], targets: dict[str, float]) -> list[str]:
    rows = []
    for name, variants in results.items():
        single_steps = [measured(r)["env_steps"] for r in variants["single process"] if r["solved_at"]]
        reference = statistics.median(single_steps) if single_steps else None
        for variant, runs in variants.items():
            values = [measured(r) for r in runs if r["solved_at"]] or [measured(r) for r in runs if measured(r)]
            steps = [v["env_steps"] for v in values]
            solved = any(r["solved_at"] for r in runs)
            ratio = "-"
            if reference and steps and solved:
                share = statistics.median(steps) / reference
                ratio = f"{share:.2f}x" + (
                    "" if variant == "single process" else (" ok" if share <= TARGET_RATIO else " NO")
                )
            rows.append(
                [
                    name,
                    variant,
                    f"{targets[name]:g}",
                    f"{sum(1 for r in runs if r['solved_at'])}/{len(runs)}",
                    spread(steps, ",.0f"),
                    spread([v["seconds"] for v in values], ".1f"),
                    spread([v["rate"] for v in values], ",.0f"),
                    ratio,
                    spread([r["wall_s"] for r in runs], ".1f"),
                    lag_text([r["lag"] for r in runs]),
                ]
            )
    head = [
        "example",
        "variant",
        "target",
        "solved",
        "env steps",
        "to target s",
        "env steps/s",
        "steps vs single",
        "wall s",
        "lag (lag:items)",
    ]
    return table_lines(head, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few updates, 1 seed, target unreachable")
    parser.add_argument("--seeds", help="comma list of run seeds (default 0,1,2; quick 0)")
    parser.add_argument("--examples", help=f"comma list of {', '.join(available())} (default: all present)")
    parser.add_argument("--out-dir", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every measurement to this file")
    args = parser.parse_args()
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    names = [n.strip() for n in args.examples.split(",")] if args.examples else available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        parser.error(f"unknown or absent examples {unknown}; present: {', '.join(available())}")
    extra = QUICK if args.quick else []
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-onpolicy-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = {n: float(Config.from_yaml(EXAMPLES[n][0], extra).params["target_return"]) for n in names}
    began, loads = time.monotonic(), [os.getloadavg()[0]]
    results: dict[str, dict[str, list[dict]]] = {n: {"single process": [], "gflowdist": []} for n in names}
    for seed in seeds:  # interleaved, so load drift hits every variant alike
        for name in names:
            for variant, run in (("single process", run_single), ("gflowdist", run_distributed)):
                result = {"seed": seed, **run(name, seed, extra, out_dir)}
                results[name][variant].append(result)
                loads.append(os.getloadavg()[0])
                print(
                    f"  {name} {variant} seed {seed}: {'solved' if result['solved_at'] else 'not solved'} "
                    f"{json.dumps(measured(result))}",
                    flush=True,
                )
    print(
        f"On-policy examples vs single process, seeds {seeds} (median, (min-max)); {load_average()}; "
        f"1-min load during the runs {min(loads):.2f}-{max(loads):.2f}; {time.monotonic() - began:.0f} s"
    )
    print("\n".join(table(results, targets)))
    print(f"run directories under {out_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
