"""The sender's side of the message size limit (Channel.isend / send), on the local engine.

A message whose encoded size ``T`` (docs/wire-format.md) is over the
channel's ``max_message_bytes`` is refused by the sender with an
``EncodeError`` (a ``TransportError``, not a ``ProtocolError``: nothing was
received) naming the size, the limit and where it comes from, the message
type and the destination; nothing reaches the wire and the channel's
sequence numbers and counters are untouched. ``T == max_message_bytes`` is
accepted by both ends. The runtime's channels take the limit and its name
from ``faults.max_message_bytes``.
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.comm.local import LocalComm
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.errors import ProtocolError, TransportError
from gflowdist.runtime.wiring import LIMIT_KEY, StopFlag, Tags, Wiring
from gflowdist.transport import EncodeError, MessageType, encode
from gflowdist.transport.channel import Channel


def trajectories(n: int) -> dict:
    return {"batch": {"x": torch.arange(4 * n, dtype=torch.float32).reshape(n, 4)}, "n": n}


def size_of(msg_type: MessageType, body: dict, seq: int = 0) -> int:
    """The encoded size T of ``body`` as rank 0's message number ``seq`` (what the channel sends)."""
    return int(encode(msg_type, body, sender=0, seq=seq).nbytes)


def test_a_message_over_the_limit_is_refused_naming_size_limit_type_and_destination():
    comm = LocalComm()
    body = trajectories(64)
    size = size_of(MessageType.TRAJECTORIES, body)
    limit = size - 1
    ch = Channel(comm, tag=5, max_message_bytes=limit, limit_name="faults.max_message_bytes")
    with pytest.raises(EncodeError) as caught:
        ch.isend(MessageType.TRAJECTORIES, body, 0)
    err = caught.value
    assert isinstance(err, TransportError) and not isinstance(err, ProtocolError)
    assert err.peer == 0
    text = str(err)
    for part in (
        f"{size}-byte TRAJECTORIES message",
        "to rank 0",
        f"faults.max_message_bytes = {limit} bytes",
        f"Raise faults.max_message_bytes to at least {size}",
        "nothing was sent",
    ):
        assert part in text, text
    # nothing on the wire, nothing counted, no sequence number used
    assert comm.try_recv(None, 5) is None
    assert ch.stats.sent == 0 and ch.stats.bytes_sent == 0 and ch.in_flight() == 0
    ch.isend(MessageType.METRICS, {"ok": 1}, 0)
    msg = ch.recv(timeout=1)
    assert msg.seq == 0 and msg.body == {"ok": 1} and ch.stats.sequence_errors == {}


def test_a_message_with_frames_is_refused_before_its_buffer_is_allocated():
    comm = LocalComm()
    body = trajectories(1024)
    size = size_of(MessageType.TRAJECTORIES, body)
    ch = Channel(comm, tag=6, max_message_bytes=size // 2)
    asked: list[int] = []
    take = ch._send_buffers.take
    ch._send_buffers.take = lambda nbytes: asked.append(nbytes) or take(nbytes)
    with pytest.raises(EncodeError, match=f"{size}-byte TRAJECTORIES"):
        ch.isend(MessageType.TRAJECTORIES, body, 0)
    assert asked == []
    small = trajectories(2)
    ch.isend(MessageType.TRAJECTORIES, small, 0)
    assert asked == [size_of(MessageType.TRAJECTORIES, small)]


def test_a_frameless_message_over_the_limit_is_refused_too():
    comm = LocalComm()
    body = {"note": "x" * 5000}
    size = size_of(MessageType.USER, body)
    ch = Channel(comm, tag=7, max_message_bytes=4096)
    with pytest.raises(EncodeError) as caught:
        ch.send(MessageType.USER, body, 0, timeout=1)
    assert f"{size}-byte USER message" in str(caught.value)
    assert "limit max_message_bytes = 4096 bytes" in str(caught.value)  # the default limit_name
    assert comm.try_recv(None, 7) is None and ch.stats.sent == 0


@pytest.mark.parametrize("body", [trajectories(16), {"note": "y" * 300}], ids=["frames", "frameless"])
def test_a_message_of_exactly_the_limit_passes_both_ends(body):
    comm = LocalComm()
    msg_type = MessageType.TRAJECTORIES if "batch" in body else MessageType.USER
    size = size_of(msg_type, body)
    at_limit = Channel(comm, tag=8, max_message_bytes=size)
    at_limit.send(msg_type, body, 0, timeout=1)
    msg = at_limit.recv(timeout=1)
    assert msg.type is msg_type and at_limit.stats.bytes_sent == at_limit.stats.bytes_received == size
    below = Channel(comm, tag=9, max_message_bytes=size - 1)
    with pytest.raises(EncodeError, match=f"{size}-byte"):
        below.isend(msg_type, body, 0)


def test_a_limit_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="max_message_bytes must be >= 1"):
        Channel(LocalComm(), tag=10, max_message_bytes=0)


def test_the_runtime_channels_send_and_receive_under_faults_max_message_bytes():
    limit = 4096
    config = Config.from_dict(
        {"layout": {"trainers": 1, "buffers": 0, "coordinator": False}, "faults": {"max_message_bytes": limit}}
    )
    comm = LocalComm()
    context = DistributedContext.create(config.layout, comm=comm)
    w = Wiring.build(context, config, StopFlag())
    assert LIMIT_KEY == "faults.max_message_bytes"
    assert comm.max_recv_bytes == limit
    for channel, tag in ((w.data, Tags.DATA), (w.control, Tags.CONTROL), (w.weights, Tags.WEIGHTS)):
        assert channel.tag == tag and channel.max_message_bytes == limit and channel.limit_name == LIMIT_KEY
    body = trajectories(512)
    size = size_of(MessageType.TRAJECTORIES, body)
    assert size > limit
    with pytest.raises(EncodeError) as caught:
        w.data.isend(MessageType.TRAJECTORIES, body, 0)
    assert f"faults.max_message_bytes = {limit} bytes" in str(caught.value)
    assert f"{size}-byte TRAJECTORIES message from rank 0 to rank 0" in str(caught.value)
