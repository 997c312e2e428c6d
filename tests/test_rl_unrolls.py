"""gflowdist.rl unroll actors (one process): unroll fields, episodes across unrolls, Box actions,
the discrete-only check, and pacing to a queue's room."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError, DeadlineError
from gflowdist.rl import UNROLL_FIELDS, EnvironmentActor, UnrollActor, categorical_actions, gaussian_actions


class RandomPolicy(UnrollActor):
    def act(self, obs):
        if self.discrete:
            logits = torch.randn(obs.shape[0], self.num_actions, generator=self.generator)
            return categorical_actions(logits, self.generator)
        mean = torch.randn(obs.shape[0], *self.action_shape, generator=self.generator)
        return gaussian_actions(mean, torch.full(self.action_shape, -0.5), self.generator)


def actor(params, **sections) -> RandomPolicy:
    config = Config.from_dict({**sections, "params": params})
    made = RandomPolicy(rank=0, config=config, generator=torch.Generator().manual_seed(3))
    made.setup()
    return made


def test_cartpole_unrolls_carry_episodes_across_unrolls_with_the_behaviour_log_probs():
    a = actor({"env_id": "CartPole-v1", "envs_per_actor": 3, "unroll_length": 16, "record_logits": True})
    batches = [a.rollout(7) for _ in range(12)]  # 576 random steps: dozens of episodes
    first = batches[0]
    assert set(first) == {*UNROLL_FIELDS, "behaviour_logits"}
    assert first["obs"].shape == (3, 16, 4) and first["action"].dtype == torch.int64
    assert first["bootstrap_obs"].shape == (3, 4) and first["policy_version"].tolist() == [7, 7, 7]
    for earlier, later in itertools.pairwise(batches):  # the next unroll starts where the last one stopped
        torch.testing.assert_close(later["obs"][:, 0], earlier["bootstrap_obs"])
    ends = 0
    for b in batches:
        log_probs = torch.log_softmax(b["behaviour_logits"], -1).gather(2, b["action"][..., None]).squeeze(2)
        torch.testing.assert_close(b["behaviour_log_prob"], log_probs)
        done = b["terminated"] | b["truncated"]
        assert bool((b["final_obs"][~done] == 0).all()) and bool((b["final_obs"][done].abs().sum(-1) > 0).all())
        # CartPole ends when the pole falls past 12 degrees (0.2095 rad) or the cart leaves [-2.4, 2.4]
        final = b["final_obs"][b["terminated"]]
        assert bool(((final[:, 2].abs() > 0.2095) | (final[:, 0].abs() > 2.4)).all())
        # the step after an end starts a new episode: CartPole resets every coordinate into [-0.05, 0.05]
        after = torch.cat([b["obs"][:, 1:], b["bootstrap_obs"][:, None]], 1)[done]
        assert bool((after.abs() <= 0.05).all())
        ends += int(done.sum())
    metrics = a.metrics()
    assert metrics["env_steps"] == 12 * 3 * 16 and metrics["episodes"] == ends >= 10
    assert 8 <= metrics["episode_return"] <= 80


def test_box_actions_come_with_their_gaussian_log_density():
    a = actor({"env_id": "Pendulum-v1", "envs_per_actor": 2, "unroll_length": 5})
    b = a.rollout(0)
    assert not a.discrete and b["action"].shape == (2, 5, 1) and b["action"].dtype == torch.float32
    assert b["behaviour_log_prob"].shape == (2, 5) and bool(torch.isfinite(b["behaviour_log_prob"]).all())
    # log N(a; mean, 0.61) <= log density at the mean: -log(sigma * sqrt(2 pi)) = 0.5 - 0.919
    assert bool((b["behaviour_log_prob"] <= 0.5 - 0.9189 + 1e-5).all())


def test_a_discrete_only_actor_names_the_continuous_space_at_setup():
    class Greedy(EnvironmentActor):
        def act(self, obs, epsilon):
            return torch.zeros(obs.shape[0], dtype=torch.int64)

    config = Config.from_dict({"params": {"env_id": "Pendulum-v1"}})
    with pytest.raises(ConfigError) as err:
        Greedy(rank=0, config=config, generator=torch.Generator()).setup()
    assert err.value.key == "params.env_id"
    assert "Greedy takes only Discrete action spaces, and Pendulum-v1 has action space Box(" in str(err.value)
    assert "use gflowdist.rl.UnrollActor" in str(err.value)


def test_an_unroll_actor_holds_back_while_its_queue_is_full_and_gives_up_at_the_deadline():
    a = actor(
        {"env_id": "CartPole-v1", "envs_per_actor": 4, "unroll_length": 4},
        replay={"sampler": "queue", "capacity": 32, "learner_batch": 8},
        sync={"weights_to_actors_every": 2},
        faults={"heartbeat_s": 0.05, "peer_timeout_s": 0.3},
    )
    # alone on its buffer: ceil(32 / 1) + (v + 2) * 8 unrolls, 4 per rollout
    for version, allowed in ((0, 48), (3, 72)):
        while a.rollout(version) is not None:
            assert a.unrolls_sent <= allowed
        assert a.unrolls_sent == allowed
    assert a.rollout(3) is None  # held: the wait began at the first refusal, above
    time.sleep(0.4)
    with pytest.raises(DeadlineError, match=r"waited 0.3 s .* for room in its queue with policy version 3"):
        a.rollout(3)
    assert a.rollout(4) is not None  # the learner took more: room again
    resumed = actor(
        {"env_id": "CartPole-v1", "envs_per_actor": 4, "unroll_length": 4},
        replay={"sampler": "queue", "capacity": 32, "learner_batch": 8},
        sync={"weights_to_actors_every": 2},
    )
    resumed.load_state_dict(a.state_dict())  # a checkpoint keeps what was sent: the pacing goes on from there
    assert resumed.unrolls_sent == 76 and resumed.rollout(4) is not None and resumed.rollout(4) is None  # 80 at v 4


@pytest.mark.parametrize("stale", [0, 1])
def test_an_unroll_actor_sends_no_unroll_that_would_be_learned_from_more_than_max_staleness_versions_later(stale):
    a = actor(
        {"env_id": "CartPole-v1", "envs_per_actor": 4, "unroll_length": 4},
        replay={"sampler": "queue", "capacity": 32, "learner_batch": 8, "max_staleness": stale, "prefetch": 0},
    )
    # alone on its buffer the learner at version u takes unrolls 8u .. 8u + 7: at version v I may have
    # sent those of versions up to v + stale, (v + stale + 1) * 8, below the queue's ceil(32) + (v + 1) * 8
    for version in (0, 1, 5):
        while a.rollout(version) is not None:
            pass
        assert a.unrolls_sent == (version + stale + 1) * 8


def test_a_queue_asked_further_ahead_than_max_staleness_is_refused():
    with pytest.raises(ConfigError, match=r"replay\.prefetch: is 1, above replay\.max_staleness 0: .* set replay"):
        Config.from_dict({"replay": {"sampler": "queue", "learner_batch": 8, "max_staleness": 0}})
    Config.from_dict({"replay": {"sampler": "queue", "learner_batch": 8, "max_staleness": 0, "prefetch": 0}})
    Config.from_dict(
        {"replay": {"sampler": "uniform", "max_staleness": 0}}
    )  # not a queue: nothing asked ahead is dropped


class _Placed:
    """Where a role runs, as the pacing reads it (``context.layout``, ``context.placement``)."""

    def __init__(self, layout, rank: int):
        self.layout, self.placement = layout, layout.for_rank(rank)


@pytest.mark.parametrize(("actors", "learner_batch", "refused"), [(2, 16, False), (4, 16, True), (4, 32, False)])
def test_a_queue_pace_under_which_no_actor_could_ever_send_is_refused_at_setup(actors, learner_batch, refused):
    """On-policy (max_staleness 0), 8 environments an actor: with 4 actors a learner batch of 16 leaves each
    actor 4 unrolls at version 0, less than one rollout; before, every actor waited out its deadline."""
    from gflowdist.layout.planning import plan_layout

    queue = {"sampler": "queue", "capacity": 64, "learner_batch": learner_batch, "max_staleness": 0, "prefetch": 0}
    config = Config.from_dict(
        {
            "layout": {"trainers": 1, "actors": actors, "buffers": 1, "coordinator": False},
            "replay": queue,
            "params": {"env_id": "CartPole-v1", "envs_per_actor": 8, "unroll_length": 4},
        }
    )
    layout = plan_layout(actors + 2, config.layout)
    rank = layout.actors[0]
    made = RandomPolicy(rank=rank, config=config, generator=torch.Generator(), context=_Placed(layout, rank))
    if not refused:
        made.setup()
        assert made.rollout(0) is not None  # its first rollout goes out
        return
    with pytest.raises(ConfigError) as err:
        made.setup()
    assert err.value.key == "replay.learner_batch"
    assert str(err.value).startswith("replay.learner_batch: is 16 (read by RandomPolicy.setup): its learners take 4 ")
    assert "e.g. replay.learner_batch: 32" in str(err.value)
