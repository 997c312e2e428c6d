"""The runtime's protocol module: each command survives the codec and is read back; others are not commands."""

from __future__ import annotations

import pytest
import torch

from gflowdist.runtime import protocol
from gflowdist.runtime.protocol import Command, MessageType, command_of, is_command
from gflowdist.transport import decode, encode


def wire(message: protocol.Outgoing):
    """``message`` as a receiver decodes it (rank 3's message number 7)."""
    return decode(encode(*message, sender=3, seq=7), sender=3)


@pytest.mark.parametrize(
    "message, command, fields",
    [
        (protocol.done(), Command.DONE, {}),
        (protocol.checkpoint("gen-0000-step-000000005"), Command.CHECKPOINT, {"name": "gen-0000-step-000000005"}),
        (
            protocol.checkpointed("gen-0000-step-000000005"),
            Command.CHECKPOINTED,
            {"name": "gen-0000-step-000000005", "refused": 0},
        ),
        (
            protocol.checkpointed("gen-0000-step-000000005", refused=2),
            Command.CHECKPOINTED,
            {"name": "gen-0000-step-000000005", "refused": 2},
        ),
        (
            protocol.saved("gen-0001-step-000000010", {"bytes": 12, "sha256": "ab" * 32}),
            Command.SAVED,
            {"name": "gen-0001-step-000000010", "file": {"bytes": 12, "sha256": "ab" * 32}},
        ),
        (
            protocol.refused("buffer rank 2 refused ...", 40),
            Command.REFUSED,
            {"text": "buffer rank 2 refused ...", "seq": 40},
        ),
        (
            protocol.lost(4, "lost rank 4 (actor on vm)"),
            Command.LOST,
            {"rank": 4, "reason": "lost rank 4 (actor on vm)"},
        ),
        (protocol.stop(), Command.STOP, {}),
        (protocol.stop("signal SIGINT"), Command.STOP, {"reason": "signal SIGINT"}),
    ],
)
def test_every_command_is_read_back_with_its_fields(message, command, fields):
    msg = wire(message)
    assert msg.type is MessageType.CONTROL and command_of(msg) is command and is_command(msg, command)
    assert {k: v for k, v in msg.body.items() if k != "cmd"} == fields
    assert all(not is_command(msg, other) for other in Command if other is not command)


def test_data_messages_carry_their_fields_and_are_no_commands():
    batch = {"x": torch.arange(6, dtype=torch.float32).reshape(3, 2)}
    sent = wire(protocol.trajectories(batch, seq=30, version=4, n=3))
    assert sent.type is MessageType.TRAJECTORIES and command_of(sent) is None
    assert (sent.body["seq"], sent.body["version"], sent.body["n"]) == (30, 4, 3)
    assert torch.equal(sent.body["batch"]["x"], batch["x"]) and sent.seq == 7  # the message number, not 30
    reply = wire(protocol.sample_reply(batch, torch.tensor([1, 2, 3])))
    assert reply.type is MessageType.SAMPLE_REPLY and reply.body["versions"].tolist() == [1, 2, 3]
    assert wire(protocol.sample_reply(None)).body == {"batch": None}
    assert wire(protocol.sample_request(8, 2)).body == {"n": 8, "version": 2, "step": 2}
    assert wire(protocol.sample_request(8, 2, step=4)).body == {"n": 8, "version": 2, "step": 4}
    assert wire(protocol.heartbeat(5, stored=9)).body == {"step": 5, "stored": 9}


@pytest.mark.parametrize("body", [{"cmd": "reboot"}, {"cmd": ["stop"]}, {"cmd": 1}, {}, ["stop"], "stop"])
def test_an_unknown_or_malformed_command_is_no_command(body):
    assert command_of(wire((MessageType.CONTROL, body))) is None


def test_prefetched_sample_requests_name_the_step_that_will_use_them() -> None:
    """replay.prefetch k: the reply used at step s was asked for k steps earlier, so it asks for beta at s."""
    from gflowdist.config import Config
    from gflowdist.runtime.loops.trainer import ReplayRequests
    from gflowdist.runtime.state import TrainerState
    from tests.support.wirings import wirings

    layout = {"trainers": 1, "buffers": 1, "coordinator": False}  # trainer 0, buffer 1
    config = Config.from_dict({"layout": layout, "replay": {"prefetch": 2, "replay_fraction": 0.25}})
    trainer, buffer = wirings(config, 2)
    for _ in range(4):  # a reply for each step's take, already on its way
        buffer.data.isend(*protocol.sample_reply(None), 0)
    requests, state = ReplayRequests(trainer, buffer=1), TrainerState()
    for version in range(4):
        state.version = version
        requests.take(state, 16)
    asked = []
    while (msg := buffer.data.try_recv(0)) is not None:
        assert msg.type is MessageType.SAMPLE_REQUEST and msg.body["n"] == trainer.settings.replayed_per_step(16)
        asked.append(msg.body)
    # asked at step 0 for steps 1 and 2, then at each step s for s + 2: each reply is used where it was meant
    assert [(b["version"], b["step"]) for b in asked] == [(0, 1), (0, 2), (1, 3), (2, 4), (3, 5)]
