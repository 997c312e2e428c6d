"""The RLlib peer of benchmarks/latency.py: APPO on the new API stack, latency-bound CartPole.

Runs in the peer's own virtual environment (ray[rllib], torch, gymnasium;
benchmarks/peer_venv.py builds it), never in gflowdist's, and imports
nothing from gflowdist::

    <peer venv>/bin/python benchmarks/rllib_peer.py '{"runners": 4, "envs_per_runner": 4, ...}' OUT.json

What it measures, with the same workload as gflowdist's Ape-X rows:

- the environment: CartPole-v1 whose every step first waits ``latency_s``
  (``time.sleep``), as ``gflowdist.rl.slow_env.SlowEnv`` does (replicated
  here as :class:`SlowCartPole`, not imported: the peer's interpreter has no
  gflowdist; tests/test_latency_peer.py checks the two wait alike);
- ``runners`` env runners (RLlib's environment-stepping processes), each
  stepping ``envs_per_runner`` environments one after another (gymnasium's
  synchronous vector environment), like an Ape-X actor's 4;
- **env steps/s**: RLlib's lifetime count of sampled environment steps
  between the first training iteration that reports steps (start-up left
  out, as gflowdist's rate starts at an actor's first report) and the last,
  over the training time between them (evaluation pauses excluded);
- **time to target**: training time (evaluation pauses excluded) to the
  first greedy evaluation (the learner's weights, argmax action, 10
  episodes without the latency, in this process) whose mean return reaches
  ``target``, as gflowdist's coordinator evaluates; evaluations every
  ``eval_every_s`` seconds of training once the learner has trained (an
  untrained network's greedy policy can score 150 by chance). RLlib's own training-episode mean
  return is recorded beside it (``curve``).

It writes one JSON object to OUT.json (``ok`` false with ``error`` when
RLlib failed), calls ``ray.shutdown()`` on every path, and stops at
``budget_s`` of training. ray's session directory is a temporary directory
of its own, removed after a run that succeeded (kept, with ray's logs,
after one that failed). It adopts ray's orphaned processes (Linux's child
subreaper) and waits for them, killing what is left after 15 s, so none
outlives it as a zombie; latency_peer.py kills whatever is left after that.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

#: the keys of the settings argument, with their defaults
DEFAULTS: dict[str, Any] = {
    "algo": "APPO",
    "runners": 4,
    "learners": 0,
    "requests_in_flight": 2,
    "envs_per_runner": 4,
    "latency_s": 0.002,
    "target": 475.0,
    "budget_s": 600.0,
    "eval_every_s": 10.0,
    "eval_episodes": 10,
    "seed": 0,
    "hidden": 128,
    "lr": 0.0005,
}


def settings(text: str) -> dict[str, Any]:
    """The run's settings: DEFAULTS updated by the JSON object ``text``; an unknown key is named."""
    given = json.loads(text)
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown peer setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    return {**DEFAULTS, **given}


def slow_cartpole_class() -> type:
    """:class:`SlowCartPole`, built on first use (gymnasium is imported only here)."""
    import gymnasium

    class SlowCartPole(gymnasium.Wrapper):
        """CartPole-v1 whose every step first waits ``latency_s`` (gflowdist's SlowEnv without CPU cost)."""

        def __init__(self, env_config: dict | None = None):
            env_config = env_config or {}
            super().__init__(gymnasium.make("CartPole-v1"))
            self.latency_s = float(env_config.get("latency_s", 0.0))

        def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
            if self.latency_s:
                time.sleep(self.latency_s)
            return self.env.step(action)

    return SlowCartPole


def greedy_return(module: Any, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` CartPole-v1 episodes (no latency) acting by argmax of ``module``."""
    import gymnasium
    import torch

    env = gymnasium.make("CartPole-v1")
    total = 0.0
    with torch.no_grad():
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done = False
            while not done:
                out = module.forward_inference({"obs": torch.as_tensor(obs, dtype=torch.float32)[None]})
                action = int(out["action_dist_inputs"][0].argmax())
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
    env.close()
    return total / episodes


def build(cfg: dict[str, Any]) -> Any:
    """The APPO (or IMPALA) algorithm of ``cfg``, new API stack."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.tune.registry import register_env

    if cfg["algo"] == "APPO":
        from ray.rllib.algorithms.appo import APPOConfig as Config
    elif cfg["algo"] == "IMPALA":
        from ray.rllib.algorithms.impala import IMPALAConfig as Config
    else:
        raise ValueError(f"algo must be APPO or IMPALA, got {cfg['algo']!r}")
    register_env("gflowdist_slow_cartpole", slow_cartpole_class())
    config = (
        Config()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment("gflowdist_slow_cartpole", env_config={"latency_s": cfg["latency_s"]})
        .env_runners(
            num_env_runners=cfg["runners"],
            num_envs_per_env_runner=cfg["envs_per_runner"],
            num_cpus_per_env_runner=1,
            max_requests_in_flight_per_env_runner=cfg["requests_in_flight"],
        )
        .learners(num_learners=cfg["learners"], num_cpus_per_learner=1)
        .training(lr=cfg["lr"], vf_loss_coeff=0.05, entropy_coeff=0.0)
        .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=[cfg["hidden"], cfg["hidden"]], vf_share_layers=True))
        .reporting(min_time_s_per_iteration=1.0)
        .debugging(seed=cfg["seed"], log_level="ERROR")
    )
    return config.build_algo()


def train(cfg: dict[str, Any], log: Any = print) -> dict[str, Any]:
    """Train until the greedy evaluation reaches ``target`` or ``budget_s``; the measurements."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo = build(cfg)
    module = algo.get_module(DEFAULT_MODULE_ID)
    began = time.perf_counter()
    paused = 0.0  # seconds spent evaluating, left out of every training time
    points: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    solved = None
    next_eval = cfg["eval_every_s"]
    try:
        while True:
            result = algo.train()
            now = time.perf_counter() - began - paused
            runners = result.get("env_runners", {})
            learned = result.get("learners", {}).get("__all_modules__", {})
            mean_return = runners.get("episode_return_mean")
            point = {
                "seconds": now,
                "env_steps": int(runners.get("num_env_steps_sampled_lifetime", 0)),
                "trained_steps": int(learned.get("num_env_steps_trained_lifetime", 0)),
                "episode_return_mean": mean_return
                if isinstance(mean_return, float) and mean_return == mean_return
                else None,
            }
            points.append(point)
            if len(points) % 10 == 0:
                log(f"peer: iteration {len(points)}, {now:.1f} s, {point['env_steps']} env steps sampled")
            if point["trained_steps"] and (now >= next_eval or now >= cfg["budget_s"]):
                next_eval = now + cfg["eval_every_s"]
                stop_clock = time.perf_counter()
                weights = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
                module.set_state(weights)
                mean = greedy_return(module, cfg["eval_episodes"], cfg["seed"] + 1000 * len(curve))
                paused += time.perf_counter() - stop_clock
                curve.append({**point, "eval_return": mean})
                log(f"peer: {now:.1f} s, {point['env_steps']} env steps, greedy return {mean:.1f}")
                if mean >= cfg["target"]:
                    solved = curve[-1]
                    break
            if now >= cfg["budget_s"]:
                break
    finally:
        algo.stop()
    sampled = [p for p in points if p["env_steps"]]  # the rate from the first steps on: start-up left out
    first, last = (sampled[0], sampled[-1]) if sampled else (points[0], points[-1])
    span = last["seconds"] - first["seconds"]
    return {
        "ok": True,
        "algo": cfg["algo"],
        "settings": cfg,
        "env_per_s": (last["env_steps"] - first["env_steps"]) / span if span > 0 else None,
        "time_to_target": solved["seconds"] if solved else None,
        "env_steps": last["env_steps"],
        "first_steps_s": sampled[0]["seconds"] if sampled else None,  # RLlib's start-up inside the training time
        "train_s": last["seconds"],
        "eval_s": paused,
        "iterations": len(points),
        "curve": curve,
    }


def become_subreaper() -> None:
    """Adopt orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``); elsewhere nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def reap_children(grace_s: float = 15.0) -> int:
    """Wait up to ``grace_s`` for every child (ray's adopted processes) to exit, then kill the rest;
    how many had to be killed."""
    import os
    import signal

    def children() -> list[int]:
        me = str(os.getpid())
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[1] == me:
                    found.append(int(entry))
        return found

    deadline = time.monotonic() + grace_s
    killed = 0
    while True:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return killed
            if pid == 0:
                break
        if time.monotonic() > deadline:
            for pid in children():
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    out = Path(argv[2])
    began = time.perf_counter()
    become_subreaper()
    ray_dir = None
    try:
        cfg = settings(argv[1])
        import ray

        versions = {"ray": ray.__version__}
        ray_dir = tempfile.mkdtemp(prefix="gflowdist-ray-")  # short: ray's sockets live under it
        ray.init(
            _temp_dir=ray_dir,
            num_cpus=cfg["runners"] + cfg["learners"] + 2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=200 * 1024 * 1024,
            configure_logging=False,
        )
        try:
            result = train(cfg)
        finally:
            ray.shutdown()
            killed = reap_children()
            if killed:
                print(f"peer: killed {killed} of ray's processes left after ray.shutdown()", flush=True)
        shutil.rmtree(ray_dir, ignore_errors=True)  # kept when RLlib failed: its logs are there
    except Exception as error:  # the peer's failure is reported to latency.py, whatever it was
        out.write_text(
            json.dumps(
                {
                    "ok": False,
                    "error": f"{type(error).__name__}: {error}",
                    "trace": traceback.format_exc(),
                    "ray_dir": ray_dir,
                }
            )
        )
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    result["versions"] = versions
    result["wall_s"] = time.perf_counter() - began
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
