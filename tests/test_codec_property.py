"""Property: every body the wire carries comes back exactly (types, dtypes, shapes, bits)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gflowdist.transport import SUPPORTED_DTYPES, MessageType, decode, encode

NUMPY_DTYPES = [np.dtype(name) for name in SUPPORTED_DTYPES if name != "bfloat16"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


def _strided(draw: st.DrawFn, array: np.ndarray) -> np.ndarray:
    """The array itself, transposed, or every other element of its first axis: non-contiguous inputs."""
    how = draw(st.sampled_from(["as is", "transposed", "stepped"]))
    if how == "transposed":
        return array.permute(tuple(reversed(range(array.ndim)))) if isinstance(array, torch.Tensor) else array.T
    if how == "stepped" and array.ndim:
        return array[::2]
    return array


@st.composite
def numpy_arrays(draw: st.DrawFn) -> np.ndarray:
    array = draw(hnp.arrays(st.sampled_from(NUMPY_DTYPES), SHAPES))
    return _strided(draw, array)


@st.composite
def torch_tensors(draw: st.DrawFn) -> torch.Tensor:
    name = draw(st.sampled_from(SUPPORTED_DTYPES))
    if name == "bfloat16":
        source = draw(hnp.arrays(np.float32, SHAPES, elements=st.floats(width=32, allow_nan=False)))
        return _strided(draw, torch.from_numpy(source).to(torch.bfloat16))
    return _strided(draw, torch.from_numpy(draw(hnp.arrays(np.dtype(name), SHAPES))))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
leaves = scalars | numpy_arrays() | torch_tensors()
bodies = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def _bits(tensor: torch.Tensor) -> bytes:
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)  # same element size: works for any strides
    return tensor.numpy().tobytes()


def same(expected: Any, actual: Any) -> bool:
    """Exact equality: same Python type (a tuple arrives as a list), dtype, shape and bits."""
    if isinstance(expected, tuple):
        expected = list(expected)
    if isinstance(expected, np.ndarray):
        return (
            type(actual) is np.ndarray
            and actual.dtype == expected.dtype
            and actual.shape == expected.shape
            and actual.tobytes() == expected.tobytes()
        )
    if isinstance(expected, torch.Tensor):
        return (
            type(actual) is torch.Tensor
            and actual.dtype == expected.dtype
            and actual.shape == expected.shape
            and _bits(actual) == _bits(expected)
        )
    if type(actual) is not type(expected):
        return False
    if isinstance(expected, float):
        return struct.pack("<d", expected) == struct.pack("<d", actual)
    if isinstance(expected, list):
        return len(expected) == len(actual) and all(map(same, expected, actual))
    if isinstance(expected, dict):
        return list(expected) == list(actual) and all(same(expected[key], actual[key]) for key in expected)
    return expected == actual


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=bodies,
    msg_type=st.sampled_from(list(MessageType)),
    sender=st.integers(0, 2**31 - 1),
    seq=st.integers(0, 2**64 - 1),
    copy=st.booleans(),
    as_bytes=st.booleans(),
)
def test_roundtrip_is_exact(body, msg_type, sender, seq, copy, as_bytes):
    buf = encode(msg_type, body, sender=sender, seq=seq)
    message = decode(buf.tobytes() if as_bytes else buf, sender=sender, copy=copy)
    assert message.type is msg_type and message.sender == sender and message.seq == seq
    assert same(body, message.body)


def test_same_detects_differences():
    """The comparison used above is strict enough to fail."""
    assert not same(np.zeros(2, np.int32), np.zeros(2, np.int64))
    assert not same(torch.zeros(2), np.zeros(2, np.float32))
    assert not same(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.float16))
    assert not same(1, True)
    assert not same(0.0, -0.0)
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert same((1, [2.5]), [1, [2.5]])
    assert same(float("nan"), float("nan"))
