"""n-step transitions, the Ape-X epsilon ladder and the environment actor (CartPole, one process)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError
from gflowdist.rl import EnvironmentActor, NStepTransitions, apex_epsilons, epsilon_greedy


def play(envs: int, lengths: list[list[int]], acc: NStepTransitions, rng: random.Random) -> dict:
    """Step ``envs`` fake environments through episodes of the given lengths (then one that never
    ends); obs = (100 * env + episode, step). Odd episodes end by truncation. Returns the rewards
    of every finished episode by (env, episode)."""
    position = [[0, 0] for _ in range(envs)]
    rewards: dict[tuple[int, int], list[float]] = {}
    while any(p[0] < len(lengths[e]) for e, p in enumerate(position)):
        obs, nxt = np.zeros((envs, 2), np.float32), np.zeros((envs, 2), np.float32)
        rew, term, trunc = np.zeros(envs), np.zeros(envs, bool), np.zeros(envs, bool)
        for e, (episode, step) in enumerate(position):
            length = lengths[e][episode] if episode < len(lengths[e]) else 10**9
            obs[e], nxt[e], rew[e] = (100 * e + episode, step), (100 * e + episode, step + 1), rng.random()
            rewards.setdefault((e, episode), []).append(float(rew[e]))
            ends = step + 1 == length
            term[e], trunc[e] = ends and episode % 2 == 0, ends and episode % 2 == 1
            position[e] = [episode + 1, 0] if ends else [episode, step + 1]
        acc.push(obs, np.arange(envs), rew, nxt, term, trunc)
    return {key: rs for key, rs in rewards.items() if key[1] < len(lengths[key[0]])}


@pytest.mark.parametrize("n", [1, 3])
def test_n_step_transitions_match_a_brute_force_count(n):
    gamma, envs, rng = 0.9, 3, random.Random(n)
    acc = NStepTransitions(envs, n, gamma, obs_shape=(2,))
    lengths = [[rng.randint(1, 7) for _ in range(4)] for _ in range(envs)]
    finished = play(envs, lengths, acc, rng)
    batch = acc.take()
    got = {
        (int(o[0]), int(o[1])): (float(r), float(d), bool(te), bool(tr), int(no[1]) - int(o[1]))
        for o, r, d, te, tr, no in zip(
            batch["obs"].tolist(),
            batch["reward"],
            batch["discount"],
            batch["terminated"],
            batch["truncated"],
            batch["next_obs"].tolist(),
            strict=False,
        )
    }
    assert len(got) == batch["action"].numel()  # nothing emitted twice
    for (e, episode), rewards in finished.items():
        for t in range(len(rewards)):
            k = min(n, len(rewards) - t)
            ends = t + k == len(rewards)
            ret, discount, terminated, truncated, ahead = got.pop((100 * e + episode, t))
            assert ret == pytest.approx(sum(gamma**j * rewards[t + j] for j in range(k)), rel=1e-5)
            assert discount == pytest.approx(gamma**k) and ahead == k
            assert (terminated, truncated) == (ends and episode % 2 == 0, ends and episode % 2 == 1)
    # what is left: steps of the never-ending episodes, each with n rewards known
    assert all(not te and not tr and ahead == n for _, _, te, tr, ahead in got.values())
    assert len(acc) == 0 and acc.take()["action"].numel() == 0


def test_apex_epsilons_follow_the_ladder():
    eps = apex_epsilons(0, 8, 8, eps=0.4, alpha=7.0)
    want = torch.tensor([0.4 ** (1 + 7 * i / 7) for i in range(8)], dtype=torch.float64)
    assert torch.allclose(eps, want)
    assert torch.equal(apex_epsilons(4, 4, 8), eps[4:])  # actor 1 of 2, 4 envs each
    assert apex_epsilons(0, 1, 1).tolist() == pytest.approx([0.4])
    with pytest.raises(ConfigError, match=r"params.epsilon"):
        apex_epsilons(0, 1, 1, eps=1.5)
    for first, count in ((6, 4), (-1, 2), (0, 9)):  # rungs outside a ladder of 8
        with pytest.raises(ValueError, match="do not fit a ladder of 8"):
            apex_epsilons(first, count, 8)


def test_epsilon_greedy_explores_at_its_rate():
    q = torch.tensor([[0.0, 1.0, 0.0, 0.0]]).repeat(20_000, 1)
    eps = torch.full((20_000,), 0.4, dtype=torch.float64)
    actions = epsilon_greedy(q, eps, torch.Generator().manual_seed(0))
    greedy_share = float((actions == 1).double().mean())  # 0.6 + 0.4 / 4 expected
    assert abs(greedy_share - 0.7) < 5 * (0.7 * 0.3 / 20_000) ** 0.5


class RandomCartPole(EnvironmentActor):
    def act(self, obs, epsilon):
        return torch.randint(0, self.num_actions, (obs.shape[0],), generator=self.generator)


def test_environment_actor_keeps_episodes_across_rollouts():
    config = Config.from_dict(
        {"params": {"env_id": "CartPole-v1", "envs_per_actor": 2, "rollout_steps": 5, "n_step": 3}}
    )
    actor = RandomCartPole(rank=0, config=config, generator=torch.Generator().manual_seed(1))
    actor.setup()
    seen = 0
    for _ in range(40):  # 400 random steps: dozens of short episodes, split across rollouts
        batch = actor.rollout(0)
        assert set(batch) == {"obs", "action", "reward", "next_obs", "terminated", "truncated", "discount"}
        seen += batch["action"].numel()
    metrics = actor.metrics()
    assert metrics["env_steps"] == 400 and metrics["episodes"] >= 10
    # every step is emitted once its episode ended or n later steps exist: at most n-1 held per env
    assert 400 - 2 * 2 <= seen <= 400
    assert 8 <= metrics["episode_return"] <= 60  # random CartPole episodes last ~22 steps
    assert "episode_return" not in actor.metrics()  # reported once


def test_a_paced_actor_waits_for_its_learner():
    config = Config.from_dict(
        {
            "replay": {"min_size_to_sample": 100},
            "sync": {"weights_to_actors_every": 10},
            "params": {"env_id": "CartPole-v1", "envs_per_actor": 2, "rollout_steps": 5, "env_steps_per_update": 8},
        }
    )
    actor = RandomCartPole(rank=0, config=config, generator=torch.Generator().manual_seed(2))
    actor.setup()
    for version, allowed in ((0, 100 + 8 * 10), (5, 100 + 8 * 15)):
        batches = 0
        while actor.rollout(version) is not None:
            batches += 1
            assert batches < 100
        # a rollout is 2 envs x 5 steps: the actor stops within one rollout past its allowance
        assert allowed <= actor.env_steps < allowed + 10, (version, actor.env_steps)
    with pytest.raises(ConfigError, match=r"params.env_steps_per_update"):
        bad = RandomCartPole(
            rank=0, config=config.apply_overrides(["params.env_steps_per_update=0"]), generator=torch.Generator()
        )
        bad.setup()
