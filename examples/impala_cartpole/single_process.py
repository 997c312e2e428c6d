"""The single-process IMPALA baseline: the distributed run's hyper-parameters, one process, no runtime.

    python examples/impala_cartpole/single_process.py [config.yaml] [key=value ...] [--json FILE]

One actor object steps all ``layout.actors x params.envs_per_actor``
environments (every actor's of the distributed run) and the learner takes
``replay.learner_batch`` of its unrolls, oldest first, per step, with the same
V-trace loss, optimizer, gradient clipping (``learner.max_grad_norm``) and
evaluation every ``sync.weights_to_coordinator_every`` learner steps; the actor
gets the learner's weights every ``sync.weights_to_actors_every`` steps. With
16 environments and a learner batch of 16, each unroll is learned from by the
step after it was made: the policy lag is 0 (the distributed run's is 1-2). The
run stops at ``params.target_return`` or after ``run.steps`` learner steps.
``env_steps`` counts the environment steps learned from (learner steps x
learner batch x unroll length), as the distributed run's coordinator does.
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
from impala import actor_critic, evaluate, impala_loss  # noqa: E402
from roles import ImpalaActor  # noqa: E402

from gflowdist.config import Config  # noqa: E402


def train(config: Config, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run to the target or ``run.steps`` learner steps; with one torch thread, as a rank has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, log)
    finally:
        torch.set_num_threads(threads)


def _train(config: Config, log: Callable[[str], None]) -> dict[str, Any]:
    params, seed = config.params, config.run.seed
    torch.manual_seed(seed)
    envs = max(int(config.layout.actors), 1) * int(params.get("envs_per_actor", 1))
    acting = config.apply_overrides([f"params.envs_per_actor={envs}", "replay.sampler=fifo"])  # no queue to pace to
    actor = ImpalaActor(rank=0, config=acting, generator=torch.Generator().manual_seed(seed))
    actor.setup()
    model = actor_critic(params)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(params.get("lr", 1e-3)))
    actor.model.load_state_dict(model.state_dict())
    batch_size, unroll = int(config.replay.learner_batch), int(params.get("unroll_length", 20))
    clip = config.learner.max_grad_norm
    env_id, target = str(params["env_id"]), float(params["target_return"])
    eval_every, episodes = config.sync.weights_to_coordinator_every, int(params.get("eval_episodes", 10))
    queue: list[dict[str, torch.Tensor]] = []
    held = 0
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    for step in range(1, config.run.steps + 1):
        while held < batch_size:
            queue.append(actor.rollout(step - 1))
            held += envs
        joined = {k: torch.cat([b[k] for b in queue]) for k in queue[0]}
        batch = {k: v[:batch_size] for k, v in joined.items()}
        rest = {k: v[batch_size:] for k, v in joined.items()}
        queue, held = ([rest] if held > batch_size else []), held - batch_size
        loss, _ = impala_loss(model, batch, params)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if step % config.sync.weights_to_actors_every == 0:
            actor.model.load_state_dict(model.state_dict())
        if eval_every and step % eval_every == 0:
            score = evaluate(model, env_id, episodes, seed=10_000 + step)
            point = {
                "seconds": round(time.perf_counter() - start, 2),
                "learner_steps": step,
                "env_steps": step * batch_size * unroll,
                "eval_return": score,
            }
            curve.append(point)
            log(json.dumps(point))
            if score >= target:
                break
    solved = [p for p in curve if p["eval_return"] >= target]
    return {
        "solved": bool(solved),
        "solved_at": solved[0] if solved else None,
        "curve": curve,
        "seconds": time.perf_counter() - start,
        "learner_steps": step,
        "env_steps": actor.env_steps,
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
