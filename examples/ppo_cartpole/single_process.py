"""The single-process PPO baseline: the distributed run's algorithm and random streams, one process, no runtime.

    python examples/ppo_cartpole/single_process.py [config.yaml] [key=value ...] [--json FILE]
    python examples/ppo_cartpole/single_process.py examples/ppo_pendulum/config.yaml

One process plays every trainer of the DD-PPO run in turn, with that trainer's
random streams: its ``params.envs`` environments (seeded as ``PPOTrainer``
seeds them), its action generator (the rank's seed, ``gflowdist.ops.rank_seed``)
and its minibatch shuffle (as ``learner.minibatches`` deals them); the model
starts from the first trainer's initial weights. Each optimizer step takes one
minibatch of every trainer, computes each trainer's gradient of its own PPO loss
(advantages normalised within that trainer's share, as each trainer does) and
steps on their mean, ``sum / trainers``, which is what the distributed run's
gradient average computes; then clipping (``learner.max_grad_norm``), the
learning-rate schedule and the evaluation every
``sync.weights_to_coordinator_every`` updates, as there. So a seed's run is
the distributed run's computation without its processes: the two differ only
where the gradient average's floating-point sum does (with 2 trainers not at
all, a + b being b + a), and ``benchmarks/onpolicy.py`` compares them seed by
seed. The run stops at ``params.target_return`` or after ``run.steps`` updates.
Written as a plain loop (no gflowdist runtime) so that it is a baseline, not a
second copy of the runtime.
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
from gflowdist.layout import Role  # noqa: E402
from gflowdist.layout.planning import plan_layout  # noqa: E402
from gflowdist.ops.seeds import rank_seed, seed_all  # noqa: E402


def train(config: Config, *, time_budget_s: float = float("inf"), log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run to the target, ``run.steps`` updates or the time budget; with one torch thread, as a rank has."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, time_budget_s, log)
    finally:
        torch.set_num_threads(threads)


def trainer_seeds(config: Config) -> list[int]:
    """The seed of each trainer rank's generator in the distributed run (rank order)."""
    nprocs = config.launch.nprocs
    if nprocs is None:
        ranks: tuple[int, ...] = tuple(range(max(int(config.layout.trainers), 1)))
    else:
        ranks = plan_layout(int(nprocs), config.layout).ranks_of(Role.TRAINER)
    return [rank_seed(config.run.seed, rank) for rank in ranks]


def _train(config: Config, time_budget_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    params, learner = config.params, config.learner
    seeds = trainer_seeds(config)
    seed_all(seeds[0])  # the distributed run's first trainer builds its model right after this
    model = make_model(params)
    optimizer, scheduler = make_optimizer(model, params, config.run.steps)
    envs = int(params.get("envs", 8))
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    # PPOTrainer's environment seeds; the runtime's minibatch shuffle (runtime.loops.learner_step)
    trainers = [
        Rollouts(params, envs, config.run.seed * 1000 + index * envs, generator)
        for index, generator in enumerate(generators)
    ]
    shuffles = [torch.Generator().manual_seed(g.initial_seed() ^ 0x5EED_5EED) for g in generators]
    env_id, target = str(params["env_id"]), float(params["target_return"])
    eval_every, episodes = config.sync.weights_to_coordinator_every, int(params.get("eval_episodes", 10))
    parameters = list(model.parameters())
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    for update in range(1, config.run.steps + 1):
        batches = [rollouts.collect(model) for rollouts in trainers]
        for _ in range(learner.epochs):
            parts = [deal(b, learner.minibatches, shuffle) for b, shuffle in zip(batches, shuffles, strict=True)]
            for minibatch in range(learner.minibatches):
                grads = []
                for share in parts:  # each trainer's gradient of its own loss
                    optimizer.zero_grad(set_to_none=True)
                    ppo_loss(model, share[minibatch], params)["loss"].backward()
                    grads.append([p.grad for p in parameters])
                for index, param in enumerate(parameters):  # their mean: the sum, then / trainers
                    total = grads[0][index].clone()
                    for other in grads[1:]:
                        total += other[index]
                    param.grad = total.div_(len(grads))
                if learner.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(parameters, learner.max_grad_norm)
                optimizer.step()
        if scheduler is not None:
            scheduler.step()
        env_steps = sum(r.env_steps for r in trainers)
        if eval_every and update % eval_every == 0:
            score = evaluate(model, env_id, episodes, seed=10_000 + update)
            point = {
                "seconds": round(time.perf_counter() - start, 2),
                "updates": update,
                "env_steps": env_steps,
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
        "env_steps": sum(r.env_steps for r in trainers),
        "model": model.state_dict(),
    }


def deal(batch: dict[str, torch.Tensor], count: int, shuffle: torch.Generator) -> list[dict[str, torch.Tensor]]:
    """``batch`` shuffled into ``count`` equal minibatches (as is for one), as a trainer deals its batch."""
    if count == 1:
        return [batch]
    items = next(iter(batch.values())).shape[0]
    return [
        {k: v[index] for k, v in batch.items()} for index in torch.randperm(items, generator=shuffle).view(count, -1)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(HERE / "config.yaml"))
    parser.add_argument("overrides", nargs="*", help="key=value, as for gflowdist run")
    parser.add_argument("--json", help="also write the result (with its evaluation curve) to this file")
    args = parser.parse_args(argv)
    config = Config.from_yaml(args.config, args.overrides)
    result = train(config)
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "model")}))
    if args.json:
        Path(args.json).write_text(json.dumps({k: v for k, v in result.items() if k != "model"}))


if __name__ == "__main__":
    main()
