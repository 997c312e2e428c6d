"""as_byte_array: the bytes of what a caller sends, viewed without a copy where possible."""

from __future__ import annotations

import numpy as np
import torch

from gflowdist.comm.buffers import as_byte_array


def test_a_flat_byte_tensor_is_viewed_not_copied():
    t = torch.arange(10, dtype=torch.uint8)
    view = as_byte_array(t)
    t[3] = 200
    assert view.dtype == np.uint8 and view.shape == (10,) and view[3] == 200


def test_other_tensors_become_their_bytes():
    floats = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert as_byte_array(floats).tobytes() == floats.numpy().tobytes()
    strided = torch.arange(12, dtype=torch.uint8).reshape(3, 4)[:, 1]  # not contiguous
    assert as_byte_array(strided).tobytes() == bytes([1, 5, 9])
    with_grad = torch.ones(2, requires_grad=True)
    assert as_byte_array(with_grad).tobytes() == np.ones(2, np.float32).tobytes()
    assert as_byte_array(b"abc").tobytes() == b"abc"
