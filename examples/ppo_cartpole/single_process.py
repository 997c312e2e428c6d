"""The single-process PPO baseline: the distributed run's hyper-parameters, one process, no runtime.

    python examples/ppo_cartpole/single_process.py [config.yaml] [key=value ...] [--json FILE]
    python examples/ppo_cartpole/single_process.py examples/ppo_pendulum/config.yaml

One process steps all ``layout.trainers x params.envs`` environments (the
environments of every trainer of the DD-PPO run), so each update learns from the
same ``trainers x envs x unroll`` items the trainers learn from together; each
pass splits them into ``learner.minibatches`` minibatches, so each optimizer
step sees the items of one minibatch of every trainer (whose gradients the
distributed run averages). Gradient clipping (``learner.max_grad_norm``), the
learning-rate schedule and the evaluation every
``sync.weights_to_coordinator_every`` updates are the same; the run stops at
``params.target_return`` or after ``run.steps`` updates. Written as a plain
loop (no gflowdist runtime) so that it is a baseline, not a second copy of the
runtime.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from ppo import Rollouts, evaluate, make_model, make_optimizer, ppo_loss  # noqa: E402

from gflowdist.config import Config  # noqa: E402


def train(config: Config, *, time_budget_s: float = float("inf"), log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run to the target, ``run.steps`` updates or the time budget; with one torch thread, as a rank has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, time_budget_s, log)
    finally:
        torch.set_num_threads(threads)


def _train(config: Config, time_budget_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    params, learner = config.params, config.learner
    seed = config.run.seed
    torch.manual_seed(seed)
    model = make_model(params)
    optimizer, scheduler = make_optimizer(model, params, config.run.steps)
    envs = max(int(config.layout.trainers), 1) * int(params.get("envs", 8))
    rollouts = Rollouts(params, envs, seed=seed * 1000, generator=torch.Generator().manual_seed(seed))
    shuffle = torch.Generator().manual_seed(seed + 1)
    env_id, target = str(params["env_id"]), float(params["target_return"])
    eval_every, episodes = config.sync.weights_to_coordinator_every, int(params.get("eval_episodes", 10))
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    for update in range(1, config.run.steps + 1):
        batch = rollouts.collect(model)
        items = batch["obs"].shape[0]
        for _ in range(learner.epochs):
            for index in torch.randperm(items, generator=shuffle).view(learner.minibatches, -1):
                out = ppo_loss(model, {k: v[index] for k, v in batch.items()}, params)
                optimizer.zero_grad(set_to_none=True)
                out["loss"].backward()
                if learner.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), learner.max_grad_norm)
                optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if eval_every and update % eval_every == 0:
            score = evaluate(model, env_id, episodes, seed=10_000 + update)
            point = {
                "seconds": round(time.perf_counter() - start, 2),
                "updates": update,
                "env_steps": rollouts.env_steps,
                "eval_return": score,
            }
            curve.append(point)
            log(json.dumps(point))
            if score >= target:
                break
        if time.perf_counter() - start > time_budget_s:
            break
    solved = [p for p in curve if p["eval_return"] >= target]
    return {
        "solved": bool(solved),
        "solved_at": solved[0] if solved else None,
        "curve": curve,
        "seconds": time.perf_counter() - start,
        "env_steps": rollouts.env_steps,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(HERE / "config.yaml"))
    parser.add_argument("overrides", nargs="*", help="key=value, as for gflowdist run")
    parser.add_argument("--json", help="also write the result (with its evaluation curve) to this file")
    args = parser.parse_args(argv)
    config = Config.from_yaml(args.config, args.overrides)
    result = train(config)
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))
    if args.json:
        Path(args.json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
