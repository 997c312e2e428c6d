"""Every malformed message raises ProtocolError naming the sender and what was wrong."""

from __future__ import annotations

import struct
import tracemalloc

import msgpack
import numpy as np
import pytest
import torch

from gflowdist.errors import ProtocolError
from gflowdist.transport import MAX_NDIM, MAX_NESTING_DEPTH, MessageType, decode, encode
from gflowdist.transport.codec import FLAG_FRAMES, PREFIX_BYTES

SENDER = 5
PREFIX = struct.Struct("<2sBBIQ")
REF_HEAD = struct.Struct("<BBQ")


def ref(dtype_code: int, shape, offset: int = 0, ext: int = 1) -> msgpack.ExtType:
    """An array reference as frames.py lays it out (shape given as signed int64s)."""
    return msgpack.ExtType(ext, REF_HEAD.pack(dtype_code, len(shape), offset) + struct.pack(f"<{len(shape)}q", *shape))


def craft(
    header: bytes,
    frames: bytes = b"",
    *,
    flags: int | None = None,
    version: int = 1,
    magic: bytes = b"GF",
    total: int | None = None,
    header_len: int | None = None,
) -> bytes:
    """A message with a hand-made msgpack header; frames start at the next 64-byte boundary."""
    header_end = PREFIX_BYTES + len(header)
    body = header
    if frames:
        body += bytes(-header_end % 64) + frames
    size = PREFIX_BYTES + len(body)
    if flags is None:
        flags = FLAG_FRAMES if frames else 0
    return (
        PREFIX.pack(
            magic, version, flags, len(header) if header_len is None else header_len, size if total is None else total
        )
        + body
    )


def record(body, *, msg_type=9, sender=SENDER, seq=0) -> bytes:
    return msgpack.packb([msg_type, sender, seq, body], use_bin_type=True)


def refused(buf, match: str, **kwargs) -> ProtocolError:
    kwargs.setdefault("sender", SENDER)
    with pytest.raises(ProtocolError, match=match) as info:
        decode(buf, **kwargs)
    assert info.value.sender == kwargs["sender"]
    assert f"rank {kwargs['sender']}" in str(info.value)
    return info.value


def test_crafting_helper_matches_the_encoder():
    body = {"a": np.arange(3, dtype=np.int64), "x": 1}
    made = craft(record({"a": ref(6, (3,)), "x": 1}), np.arange(3, dtype="<i8").tobytes())
    assert made == encode(MessageType.USER, body, sender=SENDER, seq=0).tobytes()
    np.testing.assert_array_equal(decode(made, sender=SENDER).body["a"], body["a"])


VALID = encode(
    MessageType.TRAJECTORIES, {"obs": np.arange(10, dtype=np.int64), "r": torch.ones(3)}, sender=SENDER, seq=3
).tobytes()


@pytest.mark.parametrize("cut", [0, 1, PREFIX_BYTES - 1, PREFIX_BYTES, PREFIX_BYTES + 3, len(VALID) - 1])
def test_truncated(cut):
    refused(VALID[:cut], "truncated")


def test_trailing_garbage():
    refused(VALID + b"\x00", "trailing garbage")
    plain = encode(MessageType.PING, {}, sender=SENDER, seq=0).tobytes()
    refused(plain + b"xyz", "3 bytes of trailing garbage")
    # the prefix agrees with the size, but nothing in the header accounts for the extra bytes
    refused(craft(record({}) + b"\x00\x00", header_len=len(record({}))), "2 bytes of trailing garbage")
    refused(craft(record({"a": ref(2, (3,))}), b"abc" + bytes(7)), "7 bytes of trailing garbage after the last")


def test_wrong_magic_version_flags():
    refused(b"XX" + VALID[2:], "bad magic")
    refused(VALID[:2] + b"\x02" + VALID[3:], "format version 2")
    refused(VALID[:3] + b"\x80" + VALID[4:], "flags byte is 0x80")


def test_flags_and_frames_disagree():
    refused(craft(record({"a": ref(2, (3,))}), b"abc", flags=0), "trailing garbage")
    refused(craft(record({"a": ref(2, (0,))}), flags=0), "flags say it has no frames")
    refused(craft(record({}), flags=FLAG_FRAMES), "references none")


def test_header_claims_more_than_arrived():
    refused(craft(record({}), total=10**6), "truncated: header declares 1000000 bytes")
    refused(craft(record({}), header_len=2**32 - 1), "msgpack header but the message has only")


def test_size_limits_checked_before_anything_else():
    refused(VALID, "exceeds the 64-byte limit", max_message_bytes=64)
    refused(craft(record({}), total=2**63), "over the 1073741824-byte limit")


def test_frame_past_size_limit():
    refused(craft(record({"a": ref(2, (2**20,))}), b"x"), "needs bytes \\[0, 1048576\\)")
    refused(craft(record({"a": ref(2, (2**40,))}), b"x"), "needs bytes \\[0, 1099511627776\\)")
    refused(craft(record({"a": ref(6, (2**62, 2**62, 2**62))}), b"x"), "needs bytes")  # no int64 overflow
    refused(craft(record({"a": ref(6, (0, 2**40, 2**40))}), b"x"), "would exceed the 1073741824-byte message limit")


def test_unknown_and_unexpected_type():
    refused(craft(record({}, msg_type=99)), "unknown message type 99")
    refused(craft(record({}, msg_type="PING")), "unknown message type 'PING'")
    refused(craft(record({}, msg_type=True)), "unknown message type True")
    refused(craft(record({}, msg_type=10)), "unexpected message type PING", expected_types=[MessageType.USER])


def test_sender_and_seq_checked():
    refused(craft(record({}, sender=6)), "header names sender 6 but the transport delivered it from rank 5")
    refused(craft(record({}, sender=[5])), "header names sender")
    refused(craft(record({}, seq=-1)), "sequence number -1")
    refused(craft(record({}, seq=1.5)), "sequence number 1.5")
    refused(craft(msgpack.packb([9, ref(6, (1,)), 0, {}]), bytes(8)), "header names sender")


@pytest.mark.parametrize(
    "header",
    [
        msgpack.packb({"type": 9}),
        msgpack.packb([9, SENDER, 0]),
        msgpack.packb([9, SENDER, 0, {}, 1]),
        msgpack.packb(7),
        msgpack.packb([]),
    ],
)
def test_header_shape(header):
    refused(craft(header), "not the 4-element array")


@pytest.mark.parametrize(
    "header, what",
    [
        (b"\xc1", "FormatError"),
        (b"\x94\x09\x05\x00", "incomplete"),
        (b"\x94\x09\x05\x00\xa3\xff\xfe\xfd", "UnicodeDecodeError"),
        (b"\x94\x09\x05\x00\x81\x91\x01\x02", "not allowed for map key"),
        (b"\x94\x09\x05\x00\xc0\xc0", "ExtraData"),
    ],
)
def test_not_msgpack(header, what):
    refused(craft(header), what)


@pytest.mark.parametrize(
    "claim, what",
    [
        (b"\xdd\xff\xff\xff\xff", "max_array_len"),
        (b"\xdf\xff\xff\xff\xff", "max_map_len"),
        (b"\xdb\xff\xff\xff\xff", "max_str_len|incomplete input"),
        (b"\xc6\xff\xff\xff\xff", "max_bin_len|incomplete input"),
        (b"\xc9\xff\xff\xff\xff\x01", "max_ext_len"),
    ],
)
def test_msgpack_bomb_huge_claimed_lengths(claim, what):
    refused(craft(b"\x94\x09\x05\x00" + claim + bytes(8)), what)


def test_msgpack_bomb_nested_claims_do_not_allocate_what_they_claim():
    claim, levels = 100_000, 1000
    header = b"\x94\x09\x05\x00" + (b"\xdd" + claim.to_bytes(4, "big")) * levels
    header += b"\xc0" * (claim - len(header))  # long enough that every claim is within msgpack's limits
    trusted = levels * claim * 8  # bytes of list slots if every claimed length were allocated up front
    tracemalloc.start()
    try:
        refused(craft(header), "incomplete input")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < trusted / 8


def test_msgpack_bomb_deep_nesting():
    for depth in (MAX_NESTING_DEPTH + 1, 1000, 100_000):
        refused(craft(b"\x94\x09\x05\x00" + b"\x91" * depth + b"\xc0"), "nested deeper|StackError")
    nested_maps = b"\x94\x09\x05\x00" + b"\x81\xa1k" * (MAX_NESTING_DEPTH + 1) + b"\xc0"
    refused(craft(nested_maps), f"deeper than {MAX_NESTING_DEPTH}")
    ok = craft(b"\x94\x09\x05\x00" + b"\x91" * MAX_NESTING_DEPTH + b"\xc0")
    assert decode(ok, sender=SENDER).body is not None


def test_received_bytes_keys_and_timestamps_refused():
    refused(craft(msgpack.packb([9, SENDER, 0, {b"k": 1}], use_bin_type=True)), "map key b'k' is bytes")
    refused(craft(record({"when": msgpack.Timestamp(1)})), "timestamp")
    refused(craft(record(msgpack.Timestamp(1))), "timestamp")


def test_unknown_extension_type():
    refused(craft(record({"a": msgpack.ExtType(7, b"1234567890")}), bytes(8)), "unknown msgpack extension type 7")


@pytest.mark.parametrize(
    "reference, what",
    [
        (ref(77, (2,)), "dtype code 77"),
        (ref(0, (2,)), "dtype code 0"),
        (ref(8, (2,), ext=1), "bfloat16 can only travel as a torch tensor"),
        (ref(6, (-3,)), "negative dimension"),
        (ref(6, (2, -1, 0)), "negative dimension"),
        (msgpack.ExtType(1, REF_HEAD.pack(6, MAX_NDIM + 1, 0) + bytes(8 * (MAX_NDIM + 1))), "max_ext_len"),
        (msgpack.ExtType(1, REF_HEAD.pack(6, MAX_NDIM + 1, 0)), f"{MAX_NDIM + 1} dimensions \\(at most {MAX_NDIM}\\)"),
        (msgpack.ExtType(1, REF_HEAD.pack(6, 2, 0) + bytes(8)), "expected 26 for 2 dimensions"),
        (msgpack.ExtType(1, b"\x06\x01"), "shorter than its 10-byte head"),
        (ref(6, (2,), offset=64), "leaves a gap"),
        (ref(6, (100,)), "needs bytes \\[0, 800\\)"),
    ],
)
def test_bad_array_reference(reference, what):
    refused(craft(record({"a": reference}), bytes(16)), what)


def test_overlapping_frames():
    header = record({"a": ref(6, (2,), offset=0), "b": ref(6, (2,), offset=0)})
    refused(craft(header, bytes(128)), "array frame 1: offset 0 overlaps the previous frame")
    header = record({"a": ref(6, (9,), offset=0), "b": ref(6, (2,), offset=64)})
    refused(craft(header, bytes(160)), "offset 64 overlaps the previous frame; the canonical offset is 128")


def test_nonzero_padding():
    good = encode(MessageType.USER, {"a": np.ones(3, np.int8), "b": np.ones(2)}, sender=SENDER, seq=0).tobytes()
    decode(good, sender=SENDER)
    start = len(good) - 16 - 1  # the last padding byte before the 16-byte frame "b"
    refused(good[:start] + b"\x01" + good[start + 1 :], "padding before the frame is not zero")
    header_end = PREFIX_BYTES + PREFIX.unpack_from(good)[3]
    refused(good[:header_end] + b"\x01" + good[header_end + 1 :], "padding between header and first frame")


@pytest.mark.parametrize(
    "buf, what",
    [
        ("a string", "got str"),
        (np.zeros(4, np.int32), "uint8 array"),
        (np.zeros((2, 32), np.uint8), "1-d contiguous"),
        (np.zeros(64, np.uint8)[::2], "not contiguous"),
        (torch.zeros(32, dtype=torch.float32), "uint8 CPU tensor"),
        (memoryview(bytes(64))[::2], "contiguous memoryview"),
    ],
)
def test_wrong_buffer_kind(buf, what):
    refused(buf, what)


def test_nothing_but_protocol_error_escapes_for_random_bytes():
    rng = np.random.default_rng(0)
    for size in (0, 1, 15, 16, 17, 64, 300):
        for _ in range(50):
            junk = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            if size >= PREFIX_BYTES:  # a plausible prefix, so the checks behind it are reached
                junk[:PREFIX_BYTES] = PREFIX.pack(b"GF", 1, int(rng.integers(0, 2)), size - PREFIX_BYTES, size)
            try:
                decode(junk, sender=SENDER)
            except ProtocolError:
                pass
