"""Byte buffers for the wire: zero-copy views and a receive-buffer pool.

Receiving a 64 MiB message into a fresh allocation costs a page fault per
4 KiB page (tens of milliseconds), as much as the transfer itself. The
:class:`BufferPool` hands out recycled buffers for large messages instead. A
buffer goes back into service only when nothing outside the pool references it
any more: the tensor a receive returned (and every view of it, including the
tensors :func:`gflowdist.transport.codec.decode` makes) keeps its buffer
reserved for as long as the caller holds it, so recycling never overwrites
live data.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["as_byte_array", "read_only_tensor", "BufferPool"]


def as_byte_array(data: Any) -> np.ndarray:
    """A flat uint8 numpy view of ``data`` without copying when possible.

    Accepts bytes, bytearray, memoryview, numpy arrays and CPU tensors (any
    dtype, viewed as bytes). Non-contiguous inputs and CUDA tensors are copied
    once to a contiguous CPU buffer.
    """
    if isinstance(data, torch.Tensor):
        if (
            data.dtype is torch.uint8
            and data.dim() == 1
            and not data.requires_grad
            and data.device.type == "cpu"
            and data.is_contiguous()
        ):
            return data.numpy()  # already flat bytes (a received message, typically): no reshaping
        tensor = data.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        if tensor.dtype != torch.uint8:
            tensor = tensor.reshape(-1).view(torch.uint8) if tensor.numel() else tensor.reshape(0).to(torch.uint8)
        return tensor.reshape(-1).numpy()
    if isinstance(data, np.ndarray):
        array = np.ascontiguousarray(data)
        return array.reshape(-1).view(np.uint8)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return np.frombuffer(data, dtype=np.uint8)
    raise TypeError(
        f"cannot send a {type(data).__name__}: pass bytes, a numpy array or a CPU tensor "
        "(encode Python objects with gflowdist.transport.codec.encode)"
    )


def read_only_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor view of an array that may be read-only (bytes); the transport only reads it."""
    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about non-writable arrays
        return torch.from_numpy(array)


class BufferPool:
    """Recycled message buffers (receives, and the channel's encoded sends) of at least ``min_bytes``.

    Buffers are kept in power-of-two size classes, at most ``max_buffers`` of
    them. :meth:`take` returns a uint8 array of exactly ``nbytes`` that views a
    pooled buffer when one is free (no live references), else a new one.
    """

    def __init__(self, min_bytes: int = 1 << 20, max_buffers: int = 4):
        self.min_bytes = min_bytes
        self.max_buffers = max_buffers
        self._buffers: list[np.ndarray] = []

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.min_bytes:
            return np.empty(nbytes, dtype=np.uint8)
        best = None
        for raw in self._buffers:
            # 3 = the list's reference + the loop variable + getrefcount's argument:
            # nobody else (no returned tensor, no decoded view) holds this buffer.
            if raw.nbytes >= nbytes and sys.getrefcount(raw) <= 3:
                if best is None or raw.nbytes < best.nbytes:
                    best = raw
        if best is not None:
            return best[:nbytes]
        capacity = 1 << (nbytes - 1).bit_length()
        raw = np.empty(capacity, dtype=np.uint8)
        if len(self._buffers) >= self.max_buffers:
            self._buffers.pop(0)
        self._buffers.append(raw)
        return raw[:nbytes]
