"""The IMPALA rows of benchmarks/latency.py: the IMPALA example's single process (their baseline) and
``gflowdist run examples/impala_cartpole/config.yaml`` with N unroll actors, on the same latency-bound CartPole.

The single process runs in a child process (``python benchmarks/latency_impala.py --single-worker OVERRIDES``),
as latency.py's other baselines do: one torch thread, nothing else in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from latency_jobs import load1, run_env_job
from run_reading import child_env, parse_result

__all__ = ["IMPALA", "IMPALA_MODES", "impala_batch", "run_impala", "run_impala_single"]

IMPALA = Path(__file__).resolve().parents[1] / "examples" / "impala_cartpole"
#: IMPALA, by mode: learner steps (a cap: the run stops at the target) and its evaluation cadence in learner steps
#: (each of its learner steps takes 16 unrolls of 32 steps: 512 environment steps, Ape-X's take 16)
IMPALA_MODES = {"full": (2000, 25), "quick": (600, 10), "smoke": (20, 5)}


def impala_overrides(latency_s: float, mode: dict, mode_name: str) -> list[str]:
    steps, every = IMPALA_MODES[mode_name]
    return [
        f"params.env_latency_s={latency_s}",
        f"params.target_return={mode['target']}",
        f"sync.weights_to_coordinator_every={every}",
        f"run.steps={steps}",
        "run.log_every=5",
    ]


def impala_single_worker(overrides: list[str]) -> None:
    """In this process: the IMPALA example's single_process.train; RESULT with its rates."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(IMPALA))
    import single_process

    config = single_process.Config.from_yaml(IMPALA / "config.yaml", overrides)
    result = single_process.train(config, log=lambda line: None)
    print("RESULT " + json.dumps(result), flush=True)


def run_impala_single(latency_s: float, mode: dict, mode_name: str) -> dict:
    """The IMPALA example's single process with one actor's environments (``params.envs_per_actor``): the
    baseline of the IMPALA rows, as ``single process`` is of Ape-X's."""
    overrides = [*impala_overrides(latency_s, mode, mode_name), "layout.actors=1"]
    cmd = [sys.executable, __file__, "--single-worker", json.dumps(overrides)]
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=mode["budget_s"] + 600, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"IMPALA single process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = parse_result(out.stdout)
    solved = result["solved_at"]
    return {
        "name": "single process (IMPALA)",
        "actors": 0,
        "env_per_s": result["env_steps"] / result["seconds"],
        "time_to_target": solved["seconds"] if solved else None,
        "learner_steps": solved["learner_steps"] if solved else result["learner_steps"],
        "train_s": result["seconds"],
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
    }


def impala_batch(actors: int) -> int:
    """The learner batch of IMPALA with ``actors`` actors: the example's (16 unrolls), or one rollout of every
    actor where that is more (on-policy, a smaller batch would leave an actor no whole rollout to send:
    gflowdist.rl.unroll_actor refuses it)."""
    from gflowdist.config import Config

    config = Config.from_yaml(IMPALA / "config.yaml")
    return max(int(config.replay.learner_batch), actors * int(config.params["envs_per_actor"]))


def run_impala(actors: int, latency_s: float, mode: dict, mode_name: str, out_dir: Path) -> dict:
    """``gflowdist run examples/impala_cartpole/config.yaml`` with ``actors`` unroll actors (on-policy: each
    waits for the learner's step that uses its unroll, ``replay.max_staleness`` 0)."""
    cmd = [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(IMPALA / "config.yaml"),
        "-n",
        str(actors + 3),
        f"layout.actors={actors}",
        f"run.out_dir={out_dir}",
        f"run.name=latency-impala-{actors}",
        f"replay.learner_batch={impala_batch(actors)}",
        *impala_overrides(latency_s, mode, mode_name),
    ]
    return run_env_job(f"IMPALA {actors}", actors, cmd, mode["budget_s"] + 600)


if __name__ == "__main__":
    impala_single_worker(json.loads(sys.argv[sys.argv.index("--single-worker") + 1]))
