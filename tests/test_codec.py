"""Round trips, zero-copy and copy-once behaviour of the wire codec."""

from __future__ import annotations

import threading
import tracemalloc

import msgpack
import numpy as np
import pytest
import torch

from gflowdist.errors import GflowdistError, ProtocolError, TransportError
from gflowdist.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FORMAT_VERSION,
    FRAME_ALIGNMENT,
    MAX_NDIM,
    MAX_NESTING_DEPTH,
    SUPPORTED_DTYPES,
    EncodeError,
    Message,
    MessageType,
    decode,
    encode,
)
from gflowdist.transport.codec import PREFIX_BYTES

NUMPY_DTYPES = [name for name in SUPPORTED_DTYPES if name != "bfloat16"]
TORCH_DTYPES = list(SUPPORTED_DTYPES)


def roundtrip(body, *, copy=False, as_bytes=False, msg_type=MessageType.USER, sender=2, seq=9):
    buf = encode(msg_type, body, sender=sender, seq=seq)
    message = decode(bytes(buf) if as_bytes else buf, sender=sender, copy=copy)
    assert message.type is msg_type and message.sender == sender and message.seq == seq
    return message.body


def numpy_sample(name: str, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    values = np.arange(count) - count // 2
    if name == "bool":
        return (values % 3 == 0).reshape(shape)
    return values.astype(name).reshape(shape)


def torch_sample(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    count = int(np.prod(shape))
    values = torch.arange(count) - count // 2
    if name == "bool":
        return (values % 3 == 0).reshape(shape)
    return values.to(getattr(torch, name)).reshape(shape)


def test_message_type_values_are_fixed():
    assert {member.name: member.value for member in MessageType} == {
        "TRAJECTORIES": 1,
        "SAMPLE_REQUEST": 2,
        "SAMPLE_REPLY": 3,
        "WEIGHTS": 4,
        "HEARTBEAT": 5,
        "METRICS": 6,
        "CONTROL": 7,
        "LEDGER": 8,
        "USER": 9,
        "PING": 10,
        "PRIORITIES": 11,
        "INFER_REQUEST": 12,
        "INFER_REPLY": 13,
    }


def test_public_constants():
    assert FORMAT_VERSION == 1
    assert DEFAULT_MAX_MESSAGE_BYTES == 1 << 30
    assert SUPPORTED_DTYPES == (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
    )
    assert issubclass(EncodeError, TransportError) and issubclass(EncodeError, ValueError)


@pytest.mark.parametrize("msg_type", list(MessageType))
def test_every_message_type_roundtrips(msg_type):
    assert roundtrip({"k": 1}, msg_type=msg_type) == {"k": 1}


def test_plain_values_roundtrip_exactly():
    body = {
        "none": None,
        "t": True,
        "f": False,
        "i": -(2**63),
        "u": 2**64 - 1,
        "x": 1.5,
        "nan": float("nan"),
        "s": "héllo",
        "b": b"\x00\xff",
        "l": [1, [2, [3]]],
        "d": {"e": {}},
        "empty": [],
        "tuple": (1, "a"),
    }
    out = roundtrip(body)
    assert out.pop("nan") != out.pop("nan", 0.0)  # NaN survives as NaN
    expected = dict(body, tuple=[1, "a"])
    del expected["nan"]
    assert out == expected
    assert type(out["t"]) is bool and type(out["i"]) is int and type(out["b"]) is bytes


@pytest.mark.parametrize("body", [None, 7, "just a string", [1, 2], b"raw"])
def test_non_dict_bodies(body):
    assert roundtrip(body) == body


def test_message_is_frozen():
    message = decode(encode(MessageType.PING, None, sender=0, seq=0), sender=0)
    assert isinstance(message, Message)
    with pytest.raises(AttributeError):
        message.seq = 1  # type: ignore[misc]


@pytest.mark.parametrize("name", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_numpy_arrays_roundtrip(name, shape):
    array = numpy_sample(name, shape)
    out = roundtrip({"a": array})["a"]
    assert type(out) is np.ndarray
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


@pytest.mark.parametrize("name", TORCH_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_torch_tensors_roundtrip(name, shape):
    tensor = torch_sample(name, shape)
    out = roundtrip({"t": tensor})["t"]
    assert type(out) is torch.Tensor
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    assert torch.equal(out, tensor)


def test_non_contiguous_inputs_roundtrip():
    base = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    cases = {
        "transposed": base.T,
        "strided": base[:, ::2, 1::2],
        "reversed": base[::-1],
        "broadcast": np.broadcast_to(np.arange(4.0), (3, 4)),
    }
    tensors = {
        "t_transposed": torch.arange(12.0).reshape(3, 4).t(),
        "t_bf16_strided": torch.arange(24.0).reshape(4, 6)[:, ::3].to(torch.bfloat16),
        "t_expanded": torch.arange(3).expand(2, 3),
    }
    out = roundtrip({**cases, **tensors})
    for key, value in cases.items():
        np.testing.assert_array_equal(out[key], value)
        assert out[key].flags.c_contiguous
    for key, value in tensors.items():
        assert torch.equal(out[key], value) and out[key].dtype == value.dtype


def test_negation_view_travels_as_its_values():
    base = torch.arange(4.0)
    assert torch.equal(roundtrip({"n": torch._neg_view(base)})["n"], -base)


def test_big_endian_numpy_arrives_native_with_same_values():
    array = np.arange(6, dtype=">i4")
    out = roundtrip({"a": array})["a"]
    assert out.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out, array)


def test_numpy_scalars_arrive_as_python_scalars():
    out = roundtrip({"f": np.float32(0.5), "i": np.int64(-3), "b": np.bool_(True), "u": np.uint64(2**64 - 1)})
    assert out == {"f": 0.5, "i": -3, "b": True, "u": 2**64 - 1}
    assert [type(v) for v in out.values()] == [float, int, bool, int]


def test_tensor_with_grad_and_parameter_travel_as_plain_tensors():
    weight = torch.nn.Parameter(torch.ones(2, 2))
    out = roundtrip({"w": weight, "g": torch.ones(3, requires_grad=True) * 2})
    assert type(out["w"]) is torch.Tensor and not out["w"].requires_grad
    assert torch.equal(out["g"], torch.full((3,), 2.0))


def test_decode_views_the_buffer_without_copying():
    array = np.arange(1000, dtype=np.float64)
    tensor = torch.arange(100, dtype=torch.int16)
    buf = encode(MessageType.TRAJECTORIES, {"a": array, "t": tensor}, sender=0, seq=0)
    body = decode(buf, sender=0).body
    assert np.shares_memory(body["a"], buf)
    start = buf.__array_interface__["data"][0]
    assert start <= body["t"].data_ptr() < start + buf.nbytes
    copied = decode(buf, sender=0, copy=True).body
    assert not np.shares_memory(copied["a"], buf)
    assert not start <= copied["t"].data_ptr() < start + buf.nbytes
    np.testing.assert_array_equal(copied["a"], array)


def test_views_of_read_only_buffers():
    buf = bytes(encode(MessageType.USER, {"a": np.ones(4), "t": torch.ones(4)}, sender=0, seq=0))
    body = decode(buf, sender=0).body
    assert not body["a"].flags.writeable  # a numpy view of immutable bytes stays read-only
    body["t"] += 1  # a torch tensor from read-only memory is a private copy, never an alias of bytes
    assert torch.equal(decode(buf, sender=0).body["t"], torch.ones(4))


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy", "torch", "memoryview_2d"])
def test_every_buffer_kind_decodes(kind):
    buf = encode(MessageType.WEIGHTS, {"w": torch.arange(6.0)}, sender=4, seq=1)
    given = {
        "bytes": bytes(buf),
        "bytearray": bytearray(buf),
        "memoryview": memoryview(buf),
        "numpy": buf,
        "torch": torch.from_numpy(buf.copy()),
        "memoryview_2d": memoryview(bytearray(buf)).cast("B", (1, buf.nbytes)),
    }[kind]
    message = decode(given, sender=4)
    assert torch.equal(message.body["w"], torch.arange(6.0))


def test_layout_is_aligned_and_single_buffer():
    buf = encode(MessageType.TRAJECTORIES, {"a": np.ones(3, np.int8), "b": np.ones(5)}, sender=0, seq=0)
    assert buf.dtype == np.uint8 and buf.ndim == 1 and buf.flags.c_contiguous
    body = decode(buf, sender=0).body
    start = buf.__array_interface__["data"][0]
    offsets = [value.__array_interface__["data"][0] - start for value in body.values()]
    assert offsets[0] >= PREFIX_BYTES and all(offset % FRAME_ALIGNMENT == 0 for offset in offsets)  # from start
    assert offsets[1] == offsets[0] + FRAME_ALIGNMENT  # 3 bytes, then padding to the next boundary
    assert buf.nbytes == offsets[1] + 5 * 8  # no trailing padding


def test_encode_copies_large_arrays_exactly_once():
    array = np.ones(8 << 20, dtype=np.uint8)  # 8 MiB
    tracemalloc.start()
    try:
        buf = encode(MessageType.TRAJECTORIES, {"a": array}, sender=0, seq=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The message buffer itself holds one copy; a second copy (tobytes, join) would double the peak.
    assert buf.nbytes >= array.nbytes
    assert peak < buf.nbytes + array.nbytes // 2


def test_tiny_message_is_small():
    buf = encode(MessageType.HEARTBEAT, {"t": 1.0}, sender=1, seq=1)
    header = msgpack.packb([MessageType.HEARTBEAT.value, 1, 1, {"t": 1.0}])
    assert buf.nbytes == PREFIX_BYTES + len(header)


@pytest.mark.parametrize(
    "body, where",
    [
        ({"x": object()}, "body['x']"),
        ({1: "int key"}, "dict key 1"),
        ({"a": [1, {2.5: 0}]}, "body['a'][1]"),
        ({"c": 1 + 2j}, "body['c']"),
        ({"s": {1, 2}}, "body['s']"),
        ({"a": np.zeros(2, np.complex64)}, "complex64"),
        ({"a": np.zeros(2, np.uint16)}, "uint16"),
        ({"a": np.array(["x"])}, "<U1"),
        ({"t": torch.zeros(2, dtype=torch.complex64)}, "torch.complex64"),
        ({"t": torch.zeros(2, 2).to_sparse()}, "sparse"),
        ({"m": np.ma.masked_array([1, 2], mask=[0, 1])}, "masked"),
        ({"meta": torch.empty(3, device="meta")}, "meta tensor"),
        ({"a": np.zeros((1,) * (MAX_NDIM + 1))}, f"at most {MAX_NDIM}"),
        ({"big": 2**64}, "outside [-2**63, 2**64)"),
        ({"neg": -(2**63) - 1}, "outside [-2**63, 2**64)"),
    ],
)
def test_encode_refuses_what_cannot_travel(body, where):
    with pytest.raises(EncodeError, match=None) as info:
        encode(MessageType.USER, body, sender=0, seq=0)
    assert where in str(info.value)
    assert isinstance(info.value, GflowdistError)


def test_encode_refuses_too_deep_and_cyclic_bodies():
    deep: list = []
    node = deep
    for _ in range(MAX_NESTING_DEPTH):
        node.append([])
        node = node[0]
    with pytest.raises(EncodeError, match=f"deeper than {MAX_NESTING_DEPTH}"):
        encode(MessageType.USER, deep, sender=0, seq=0)
    assert roundtrip(deep[0]) == deep[0]  # one level less is fine
    cycle: dict = {}
    cycle["self"] = cycle
    with pytest.raises(EncodeError, match="cycle"):
        encode(MessageType.USER, cycle, sender=0, seq=0)


@pytest.mark.parametrize(
    "kwargs, what",
    [
        ({"msg_type": 42}, "unknown message type"),
        ({"msg_type": True}, "unknown message type"),
        ({"sender": -1}, "sender"),
        ({"sender": 2**31}, "sender"),
        ({"sender": "0"}, "sender"),
        ({"seq": -1}, "seq"),
        ({"seq": 2**64}, "seq"),
        ({"seq": 1.0}, "seq"),
    ],
)
def test_encode_refuses_bad_header_fields(kwargs, what):
    args = {"msg_type": MessageType.USER, "sender": 0, "seq": 0, **kwargs}
    with pytest.raises(EncodeError, match=what):
        encode(args.pop("msg_type"), {}, **args)


def test_plain_int_message_type_is_accepted():
    assert decode(encode(5, None, sender=0, seq=0), sender=0).type is MessageType.HEARTBEAT


def test_expected_types():
    buf = encode(MessageType.METRICS, {}, sender=3, seq=0)
    assert decode(buf, sender=3, expected_types={MessageType.METRICS}).type is MessageType.METRICS
    with pytest.raises(ProtocolError, match="unexpected message type METRICS") as info:
        decode(buf, sender=3, expected_types=(MessageType.PING, MessageType.CONTROL))
    assert info.value.sender == 3


def test_encode_is_deterministic():
    body = {"a": np.arange(5), "t": torch.ones(2, 3), "x": [1, "y"]}
    first = encode(MessageType.USER, body, sender=1, seq=2)
    second = encode(MessageType.USER, body, sender=1, seq=2)
    assert first.tobytes() == second.tobytes()


def test_failed_encode_leaves_the_encoder_usable():
    body = {"a": np.arange(4), "t": torch.ones(2)}
    expected = encode(MessageType.USER, body, sender=0, seq=0).tobytes()
    with pytest.raises(EncodeError, match="uint16") as info:
        encode(MessageType.USER, {"x": np.ones(3), "bad": np.zeros(2, np.uint16)}, sender=0, seq=0)
    assert "could not be packed" not in str(info.value)
    with pytest.raises(EncodeError, match="outside"):
        encode(MessageType.USER, {"x": np.ones(3), "big": 2**70}, sender=0, seq=0)
    assert encode(MessageType.USER, body, sender=0, seq=0).tobytes() == expected


def test_threads_encode_concurrently():
    failures: list[str] = []

    def work(rank: int) -> None:
        for seq in range(200):
            body = {"rank": rank, "a": np.full(rank + seq % 5 + 1, rank, dtype=np.int32), "t": torch.full((3,), seq)}
            got = decode(encode(MessageType.TRAJECTORIES, body, sender=rank, seq=seq), sender=rank).body
            if got["rank"] != rank or not np.array_equal(got["a"], body["a"]) or not torch.equal(got["t"], body["t"]):
                failures.append(f"rank {rank} seq {seq}")

    threads = [threading.Thread(target=work, args=(rank,)) for rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
