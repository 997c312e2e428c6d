"""Byte buffers for the wire: zero-copy views and a receive-buffer pool.

Receiving a 64 MiB message into a fresh allocation costs a page fault per
4 KiB page (tens of milliseconds), as much as the transfer itself. The
:class:`BufferPool` hands out recycled buffers for large messages instead. A
buffer goes back into service only when nothing outside the pool references it
any more: the tensor a receive returned (and every view of it, including the
tensors :func:`gflowdist.transport.codec.decode` makes) keeps its buffer
reserved for as long as the caller holds it, so recycling never overwrites
live data.

A pooled buffer is also backed by transparent huge pages (2 MiB) where the
kernel offers them (``/sys/kernel/mm/transparent_hugepage/enabled`` set to
``always`` or ``madvise``): it is a mapping of its own (``mmap``), given to
``madvise(MADV_HUGEPAGE)``, and starts at a 2 MiB boundary. (Memory from
``malloc`` is not enough: once the allocator has raised its mapping threshold
a buffer of a few MiB comes from the heap, where it was measured on 4 KiB
pages after a run of small messages.) Copying a message into or out of memory
on 4 KiB pages costs a TLB miss per page: a 1 MiB round trip of a user's loop
between two MPI ranks took 266 us with the pool's buffers from ``malloc`` and
139-147 us with these, where raw mpi4py ``Send``/``Recv`` of a preallocated
NumPy array took 213 us and of one on huge pages 106 us (docs/transport.md,
"Receive buffers on huge pages"). A buffer's pages are only committed where a
message is written, a whole huge page at a time.
"""

from __future__ import annotations

import mmap
import sys
import warnings
from typing import Any

import numpy as np
import torch

__all__ = ["as_byte_array", "read_only_tensor", "BufferPool", "HUGE_PAGE", "huge_page_buffer"]


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


#: pooled buffers start at a multiple of this and span whole multiples of it: one huge page on x86-64 and arm64
HUGE_PAGE = 2 << 20


def _huge_page_owner(capacity: int) -> tuple[np.ndarray, int]:
    """A uint8 array over a fresh anonymous mapping of ``capacity`` + :data:`HUGE_PAGE` bytes, advised to use
    huge pages, and where in it a 2 MiB boundary starts (the array owns the mapping: every view of it keeps
    it, and the mapping is unmapped with the array)."""
    private = getattr(mmap, "MAP_PRIVATE", None)  # not shared memory (Unix): its huge pages are shmem's setting
    region = mmap.mmap(-1, capacity + HUGE_PAGE) if private is None else mmap.mmap(-1, capacity + HUGE_PAGE, private)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only; elsewhere the kernel picks the pages
    if advice is not None:
        try:
            region.madvise(advice)
        except OSError:  # EINVAL: a kernel built without transparent huge pages; the buffer works the same
            pass
    owner = np.frombuffer(region, dtype=np.uint8)
    return owner, -owner.ctypes.data % HUGE_PAGE


def huge_page_buffer(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` starting at a 2 MiB boundary of a mapping advised to use huge pages:
    what :class:`BufferPool` hands out (the benchmarks give a raw loop the same buffer)."""
    owner, start = _huge_page_owner(-(-nbytes // HUGE_PAGE) * HUGE_PAGE)
    return owner[start : start + nbytes]


class BufferPool:
    """Recycled message buffers (receives, and the channel's encoded sends) of at least ``min_bytes``.

    Buffers are kept in power-of-two size classes of at least :data:`HUGE_PAGE`, at most ``max_buffers``
    of them, each aligned to :data:`HUGE_PAGE` (see the module's docstring). :meth:`take` returns a
    uint8 array of exactly ``nbytes`` that views a pooled buffer when one is free (no live references),
    else a new one.

    With ``huge_pages=False`` the buffers are plain NumPy arrays of the power of two at or above
    ``nbytes`` (the gloo lanes' frames: a 40-byte header written into a frame on huge pages would commit
    a whole 2 MiB page).
    """

    def __init__(self, min_bytes: int = 1 << 20, max_buffers: int = 4, *, huge_pages: bool = True):
        self.min_bytes = min_bytes
        self.max_buffers = max_buffers
        self.huge_pages = huge_pages
        # (owner, start, capacity): the array that owns the memory (whose reference count says whether a
        # view of it is alive: views of views keep the owner as their base), where the aligned part starts
        self._buffers: list[tuple[np.ndarray, int, int]] = []

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.min_bytes:
            return np.empty(nbytes, dtype=np.uint8)
        best = None
        for entry in self._buffers:
            # 2 = the entry's reference + getrefcount's argument: nobody else (no returned
            # tensor, no decoded view: every view's base is the owner) holds this buffer.
            if entry[2] >= nbytes and sys.getrefcount(entry[0]) <= 2 and (best is None or entry[2] < best[2]):
                best = entry
        if best is not None:
            owner, start, _ = best
            return owner[start : start + nbytes]
        if self.huge_pages:
            capacity = max(HUGE_PAGE, 1 << (nbytes - 1).bit_length())
            owner, start = _huge_page_owner(capacity)
        else:
            capacity = 1 << (nbytes - 1).bit_length()
            owner, start = np.empty(capacity, dtype=np.uint8), 0
        if len(self._buffers) >= self.max_buffers:
            self._buffers.pop(0)
        self._buffers.append((owner, start, capacity))
        return owner[start : start + nbytes]
