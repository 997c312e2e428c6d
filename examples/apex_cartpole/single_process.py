"""The single-process DQN baseline: the Ape-X run's hyper-parameters, one process, no runtime.

    python examples/apex_cartpole/single_process.py [config.yaml] [key=value ...]

Same classes as the distributed run (dqn.py), same config file: one actor
object steps all ``layout.actors x params.envs_per_actor`` environments (so
the epsilon ladder is the same), a local prioritized ReplayBuffer holds the
transitions, and the learner takes ``replay.learner_batch`` items per step.
Acting and learning alternate by the actors' pacing rule
(``params.env_steps_per_update`` environment steps per learner step, see
gflowdist.rl.env_actor): the actor steps while it may, the learner learns
while the actor is ahead. Every
``sync.weights_to_coordinator_every`` learner steps the greedy policy is evaluated; the run
stops when it reaches ``params.target_return`` (or after ``run.steps``
learner steps). Prints one line per evaluation and a summary.
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
from dqn import DQNActor, DQNLearner, evaluate  # noqa: E402

from gflowdist.config import Config  # noqa: E402
from gflowdist.replay import ReplayBuffer  # noqa: E402


def build(config: Config) -> tuple[DQNActor, DQNLearner, ReplayBuffer]:
    """One actor with every environment of the distributed run, a learner, a buffer."""
    envs = max(config.layout.actors, 1) * int(config.params.get("envs_per_actor", 1))
    local = config.apply_overrides([f"params.envs_per_actor={envs}"])
    seed = config.run.seed
    actor = DQNActor(rank=0, config=local, generator=torch.Generator().manual_seed(seed))
    actor.setup()
    torch.manual_seed(seed)
    learner = DQNLearner(config.params, actor.obs_shape[0], actor.num_actions)
    actor.model.load_state_dict(learner.model.state_dict())
    replay = config.replay
    buffer = ReplayBuffer.prioritized(
        replay.capacity, replay.priority_alpha, replay.priority_beta, generator=torch.Generator().manual_seed(seed + 1)
    )
    return actor, learner, buffer


def train(config: Config, *, time_budget_s: float = float("inf"), log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run until the evaluation reaches the target, ``run.steps`` learner steps, or the budget.

    With one torch thread, as every rank of ``gflowdist run`` has (OMP_NUM_THREADS=1): a
    second thread only spins against the other processes on a small machine.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(config, time_budget_s, log)
    finally:
        torch.set_num_threads(threads)


def _train(config: Config, time_budget_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    params, replay = config.params, config.replay
    actor, learner, buffer = build(config)
    if actor.pace is None:
        raise SystemExit(
            "the single-process baseline needs params.env_steps_per_update (its ratio of acting to learning)"
        )
    eval_every = config.sync.weights_to_coordinator_every  # as often as the Ape-X run evaluates
    target = float(params.get("target_return", 475.0))
    weights_every = config.sync.weights_to_actors_every
    curve: list[dict[str, float]] = []
    start = time.perf_counter()
    version = seq = 0
    solved = False
    while not solved and version < config.run.steps and time.perf_counter() - start < time_budget_s:
        if not (actor.paced(version) and len(buffer) >= replay.min_size_to_sample):
            batch = actor.collect()
            buffer.extend(
                batch, producer=0, seq=seq, policy_version=version, priorities=actor.initial_priorities(batch)
            )
            seq += int(batch["action"].numel())
            continue
        sampled, info = buffer.sample(replay.learner_batch, step=version)
        sampled["weights"] = info["weights"]
        _, priorities = learner.update(sampled)
        buffer.update_priorities(info["keys"], priorities)
        version += 1
        if version % weights_every == 0:
            actor.load_weights(learner.model.state_dict(), version)
        if version % eval_every == 0:
            point = {
                "seconds": time.perf_counter() - start,
                "env_steps": actor.env_steps,
                "learner_steps": version,
                "eval_return": evaluate(
                    learner.model, str(params["env_id"]), int(params.get("eval_episodes", 10)), seed=10_000 + version
                ),
            }
            curve.append(point)
            log(
                f"step {version:6d}  env steps {actor.env_steps:7d}  {point['seconds']:6.1f} s  "
                f"eval return {point['eval_return']:6.1f}"
            )
            solved = point["eval_return"] >= target
    seconds = time.perf_counter() - start
    return {
        "solved": solved,
        "seconds": seconds,
        "env_steps": actor.env_steps,
        "learner_steps": version,
        "env_steps_per_s": actor.env_steps / seconds,
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(HERE / "config.yaml"))
    parser.add_argument("overrides", nargs="*", help="key=value, as for gflowdist run")
    parser.add_argument("--json", help="write the result (curve included) to this file")
    args = parser.parse_args(argv)
    config = Config.from_yaml(args.config, args.overrides)
    result = train(config)
    print(
        f"{'solved' if result['solved'] else 'NOT solved'}: {result['seconds']:.1f} s, "
        f"{result['env_steps']} env steps ({result['env_steps_per_s']:.0f}/s), "
        f"{result['learner_steps']} learner steps"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["solved"] else 1


if __name__ == "__main__":
    sys.exit(main())
