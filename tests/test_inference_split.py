"""An actor's environments in groups (``inference.split``): the double-buffer bookkeeping, without ranks.

A fake inference channel answers the real :class:`~gflowdist.runtime.remote_policy.RemotePolicy`'s requests with
the actor's own ``act`` (the way an inference rank would), each reply with a policy version of the test's
choosing, and logs every send, receive and environment step. Checked: with split 2 each group's request is in
flight while the other group steps, no request outlives a rollout, a split actor produces the same transitions
and unrolls as an unsplit one acting locally (a deterministic policy, the same seed), a rollout is stamped with
its oldest reply's version, results are taken in the order sent, and a split that does not divide the
environments is a config error naming ``inference.split``.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gflowdist.config import Config
from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.rl import EnvironmentActor, UnrollActor
from gflowdist.runtime import protocol
from gflowdist.runtime.remote_policy import RemotePolicy
from gflowdist.transport import Message, MessageType

INFERENCE_RANK = 9


class FixedQ(EnvironmentActor):
    """A deterministic policy: push the cart the way the pole leans (epsilon ignored)."""

    def act(self, obs, epsilon):
        return (obs[:, 2] > 0).long()


class FixedUnroll(UnrollActor):
    """A deterministic policy with log-probabilities and logits, as an unroll actor's act returns them."""

    def act(self, obs):
        logits = torch.stack([-obs[:, 2], obs[:, 2]], dim=1)
        action = (obs[:, 2] > 0).long()
        log_prob = torch.log_softmax(logits, dim=1).gather(1, action[:, None]).squeeze(1)
        return {"action": action, "log_prob": log_prob, "logits": logits}


class FakeInference:
    """The inference channel of an actor: requests are answered, one at a time, by ``policy.act``."""

    def __init__(self, policy, log: list, versions):
        self.policy, self.log, self.versions = policy, log, iter(versions)
        self.asked: list[dict] = []  # requests not yet answered
        self.sent_done = False

    def isend(self, msg_type, body, dst):
        assert dst == INFERENCE_RANK
        if msg_type is MessageType.INFER_REQUEST:
            self.asked.append(body)
            self.log.append(("send", body["seq"]))
        return None

    def send(self, msg_type, body, dst):
        self.sent_done = True

    def try_recv(self, source):
        if not self.asked:
            return None
        body = self.asked.pop(0)
        out = self.policy.act(body["obs"], *body["args"])
        self.log.append(("recv", body["seq"]))
        reply = protocol.infer_reply(out, version=next(self.versions), seq=body["seq"], batch=0, size=1)[1]
        return Message(MessageType.INFER_REPLY, INFERENCE_RANK, 0, reply)


def _wiring(channel) -> SimpleNamespace:
    return SimpleNamespace(
        rank=1,
        inference=channel,
        settings=SimpleNamespace(inference_reply_s=5.0),
        timer=SimpleNamespace(wait_on=lambda *a: contextlib.nullcontext()),
        liveness=SimpleNamespace(keep_alive=lambda: None),
        context=None,
    )


def _actor(cls, *, split: int | None, envs: int | None = 4, seed: int = 3, **params):
    """An actor of ``cls`` set up as a job would (``split``: None = no inference rank), ``envs`` CartPoles
    (None: the actor's default, 1)."""
    data = {"layout": {"inference": 1}, "inference": {"split": split or 1}}
    data["params"] = {"env_id": "CartPole-v1", "rollout_steps": 5, **params}
    if envs is not None:
        data["params"]["envs_per_actor"] = envs
    config = Config.from_dict(data)
    placement = SimpleNamespace(inference=INFERENCE_RANK if split else None)
    actor = cls(
        rank=1,
        config=config,
        generator=torch.Generator().manual_seed(seed),
        context=SimpleNamespace(placement=placement),
    )
    actor.setup()
    return actor


def _remote(actor, log: list, versions=None) -> RemotePolicy:
    channel = FakeInference(actor, log, versions if versions is not None else iter(lambda: 7, None))
    remote = RemotePolicy(_wiring(channel), INFERENCE_RANK)
    actor.remote = remote
    step_group = actor.step_group

    def logged_step(group, actions):
        log.append(("step", group, tuple(remote.outstanding)))
        return step_group(group, actions)

    actor.step_group = logged_step
    return remote


def test_each_groups_request_is_in_flight_while_the_other_group_steps():
    actor, log = _actor(FixedQ, split=2), []
    remote = _remote(actor, log)
    assert [len(env.envs) for env in actor.groups] == [2, 2] and actor.rows == [slice(0, 2), slice(2, 4)]
    actor.collect()
    steps = [entry for entry in log if entry[0] == "step"]
    assert [s[1] for s in steps] == [0, 1] * 5  # group 0 then group 1, each of the 5 vector steps
    # while a group steps, the other group's request is out: every step but the rollout's very last
    overlapped = [s for s in steps if s[2]]
    assert len(overlapped) == 2 * 5 - 1 and steps[-1][2] == ()
    assert max(len(s[2]) for s in steps) == 1  # (its own was answered just before it stepped)
    sends = [e for e in log if e[0] == "send"]
    assert [e[1] for e in sends] == list(range(10)) and not remote.outstanding
    # the first two requests go out together, then each group asks again right after its step
    assert log[:2] == [("send", 0), ("send", 1)]
    assert log[2:6] == [("recv", 0), ("step", 0, (1,)), ("send", 2), ("recv", 1)]
    remote.finish()
    assert actor.remote.w.inference.sent_done


def test_split_actor_makes_the_transitions_an_unsplit_one_makes():
    local = _actor(FixedQ, split=None, n_step=2)
    split = _actor(FixedQ, split=2, n_step=2)
    _remote(split, [])
    for _ in range(8):  # 40 vector steps: episodes end and reset inside both
        a, b = local.collect(), split.collect()
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert local.env_steps == split.env_steps == 8 * 5 * 4
    assert local.episodes == split.episodes > 0
    assert np.array_equal(local.obs, split.obs) and np.array_equal(local.episode_return, split.episode_return)


def test_split_unroll_actor_makes_the_unrolls_an_unsplit_one_makes():
    local = _actor(FixedUnroll, split=None, unroll_length=6, record_logits=True)
    split = _actor(FixedUnroll, split=4, unroll_length=6, record_logits=True)
    remote = _remote(split, [])
    for _ in range(4):
        remote.mark()
        a, b = local.rollout(0), split.rollout(0)
        for key in a:
            if key != "policy_version":
                assert torch.equal(a[key], b[key]), key
        assert b["policy_version"].tolist() == [7] * 4  # the version the replies carried
    assert split.unrolls_sent == local.unrolls_sent == 16


def test_a_rollout_is_stamped_with_its_oldest_replys_version():
    actor, log = _actor(FixedUnroll, split=2, envs=2, unroll_length=3), []
    # 6 replies in this rollout (3 steps x 2 groups); the oldest version among them is 4
    remote = _remote(actor, log, iter([9, 9, 4, 10, 11, 12, 20, 20, 20, 20, 20, 20]))
    remote.mark()
    assert actor.rollout(0)["policy_version"].tolist() == [4, 4]
    assert remote.version == 12
    remote.mark()  # no reply of the first rollout is in the second: every request was answered inside it
    assert actor.rollout(0)["policy_version"].tolist() == [20, 20]


def test_results_are_taken_in_the_order_sent():
    actor, log = _actor(FixedQ, split=2), []
    remote = _remote(actor, log)
    first = remote.submit(actor.obs_tensor()[:2], actor.epsilon[:2])
    second = remote.submit(actor.obs_tensor()[2:], actor.epsilon[2:])
    with pytest.raises(GflowdistError, match=f"took the result of inference request {second}, but its oldest"):
        remote.result(second)
    with pytest.raises(GflowdistError, match=r"finished with inference requests \[0, 1\] unanswered"):
        remote.finish()
    assert remote.result(first).shape == (2,) and remote.result(second).shape == (2,)
    remote.finish()


def test_one_group_without_an_inference_rank_or_with_split_1():
    assert len(_actor(FixedQ, split=None).groups) == 1
    actor, log = _actor(FixedQ, split=1), []
    _remote(actor, log)
    actor.collect()
    # one request for all 4 environments, answered before they step
    assert [e[0] for e in log[:3]] == ["send", "recv", "step"] and all(e[2] == () for e in log if e[0] == "step")


def test_a_split_that_does_not_divide_the_environments_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"layout": {"inference": 1}, "inference": {"split": 3}, "params": {"envs_per_actor": 4}})
    assert err.value.key == "inference.split" and "does not divide params.envs_per_actor (4)" in str(err.value)
    # without inference ranks the split is not used, so not checked
    Config.from_dict({"inference": {"split": 3}, "params": {"envs_per_actor": 4}})
    # an actor whose environment count comes from elsewhere is refused at setup, naming the key too
    with pytest.raises(ConfigError) as err:
        _actor(FixedQ, split=2, envs=None)
    assert (
        err.value.key == "inference.split"
        and "does not divide this actor's 1 environments (params.envs_per_actor)" in str(err.value)
    )
