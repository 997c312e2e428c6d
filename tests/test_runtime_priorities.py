"""Prioritized replay across ranks, one process: the bodies the loops exchange and what each side does with them.

Every message goes through the real codec (encode, decode) between the
buffer side (a real ReplayBuffer) and the trainer side, in the order the
loops use them: initial priorities in, weighted keyed batch out, new
priorities back, stale ones counted. The multi-rank run is in
tests/test_example_apex_cartpole.py.
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.replay import ReplayBuffer
from gflowdist.runtime import protocol
from gflowdist.runtime.loops.client import concat_batches
from gflowdist.runtime.loops.priorities import (
    apply_priority_update,
    initial_priorities,
    priority_update,
    replayed_batch,
    sample_reply_for,
)
from gflowdist.transport import MessageType, decode, encode


def wire(message: protocol.Outgoing):
    return decode(encode(*message, sender=2, seq=1), sender=2)


class Learner:
    """Returns |x| as the new priority of each item (the stand-in for |TD error|)."""

    def priorities(self, batch):
        return batch["x"].abs().flatten()

    def initial_priorities(self, batch):
        return batch["x"].flatten() * 0 + 3.0


def items(values: list[float]) -> dict[str, torch.Tensor]:
    return {"x": torch.tensor(values).view(-1, 1)}


def test_the_priority_loop_closes_through_the_codec():
    replay = ReplayBuffer.prioritized(
        4, alpha=1.0, beta=1.0, beta_final=0.0, beta_steps=10, generator=torch.Generator().manual_seed(0)
    )
    learner = Learner()
    batch = items([1.0, -2.0, 3.0, -4.0])
    sent = wire(protocol.trajectories(batch, seq=0, version=0, n=4, priorities=initial_priorities(learner, batch, 4)))
    replay.extend(sent.body["batch"], producer=2, seq=0, policy_version=0, priorities=sent.body["priorities"])
    assert replay.sampler.scaled[:4].tolist() == pytest.approx([3.0 + 1e-6] * 4)
    reply = wire(sample_reply_for(replay, 6, step=10))  # beta annealed to 0 at the learner's step 10
    replayed = replayed_batch(reply.body)
    assert set(replayed) == {"x", "weights", "keys"} and torch.equal(replayed["weights"], torch.ones(6))
    fresh = items([9.0, 9.0])
    learned = concat_batches(fresh, replayed)
    assert learned["keys"][:2].tolist() == [-1, -1] and learned["weights"][:2].tolist() == [1.0, 1.0]
    update = priority_update(learner, learned, replayed=6)
    assert update[0] is MessageType.PRIORITIES
    back = wire(update)
    assert torch.equal(back.body["keys"], replayed["keys"])  # only the replayed items, fresh ones left out
    assert torch.equal(back.body["priorities"], replayed["x"].abs().flatten())
    assert apply_priority_update(replay, back.body, back.sender) == 6
    slots = replayed["keys"] % 4
    assert replay.sampler.scaled[slots].tolist() == pytest.approx((replayed["x"].abs().flatten() + 1e-6).tolist())
    replay.extend(items([5.0, 6.0, 7.0, 8.0]), producer=2, seq=4, policy_version=1)  # every slot reused
    assert apply_priority_update(replay, back.body, back.sender) == 0
    assert replay.counters["stale_priority_updates"] == 6 and replay.counters["priority_updates"] == 6


def test_a_uniform_buffer_sends_plain_batches_and_no_update_goes_back():
    replay = ReplayBuffer.uniform(4, generator=torch.Generator().manual_seed(0))
    replay.extend(items([1.0, 2.0]), producer=1, seq=0, policy_version=0)
    replayed = replayed_batch(wire(sample_reply_for(replay, 3, step=0)).body)
    assert set(replayed) == {"x"}
    assert priority_update(Learner(), concat_batches(items([0.5]), replayed), replayed=3) is None
    assert replayed_batch(wire(sample_reply_for(ReplayBuffer.uniform(4), 3, step=0)).body) is None


def test_a_pure_learner_batch_is_the_replay_alone_and_nothing_is_none():
    replayed = {"x": torch.ones(3, 1), "weights": torch.ones(3), "keys": torch.arange(3)}
    assert concat_batches(None, replayed)["keys"].tolist() == [0, 1, 2]
    assert concat_batches(None, None) is None


@pytest.mark.parametrize(
    "hook, words",
    [
        ("priorities", "Short.priorities returned 1 priorities for a batch of 2"),
        ("initial_priorities", "Short.initial_priorities returned 1"),
    ],
)
def test_a_hook_returning_the_wrong_count_is_named(hook, words):
    class Short:
        def priorities(self, batch):
            return torch.ones(1)

        initial_priorities = priorities

    batch = {"x": torch.ones(2, 1), "keys": torch.arange(2), "weights": torch.ones(2)}
    with pytest.raises(GflowdistError, match=words):
        if hook == "priorities":
            priority_update(Short(), batch, replayed=2)
        else:
            initial_priorities(Short(), batch, 2)


def test_a_malformed_update_names_its_sender():
    replay = ReplayBuffer.prioritized(2)
    replay.extend(items([1.0, 2.0]), producer=0, seq=0, policy_version=0)
    with pytest.raises(GflowdistError, match="from rank 5"):
        apply_priority_update(replay, {"keys": torch.tensor([0, 1]), "priorities": torch.tensor([1.0])}, 5)


@pytest.mark.parametrize(
    "data, key, words",
    [
        (
            {"replay": {"sampler": "prioritized", "priority_beta_final": 1.0}},
            "replay.sampler.beta_steps",
            "must be >= 1",
        ),
        (
            {"replay": {"sampler": {"name": "prioritized", "beta_steps": 100}}},
            "replay.sampler.beta_steps",
            "nothing to anneal towards",
        ),
        (
            {"replay": {"priority_beta_steps": 100}},
            "replay.priority_beta_steps",
            r"applies to sampler 'prioritized' only, and replay.sampler is 'uniform' \(new spelling: "
            r"replay.sampler: \{name: prioritized, beta_steps: 100\}\)",
        ),
        (
            {"sync": {"weights_to_coordinator_every": 10}, "layout": {"coordinator": False}},
            "sync.weights_to_coordinator_every",
            "no coordinator to send the weights to",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_key(data, key, words):
    with pytest.raises(ConfigError, match=words) as err:
        Config.from_dict(data)
    assert err.value.key == key
