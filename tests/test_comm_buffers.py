"""as_byte_array: the bytes of what a caller sends, viewed without a copy where possible; the receive-buffer pool:
recycled only when free, aligned to and backed by huge pages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gflowdist.comm.buffers import HUGE_PAGE, BufferPool, as_byte_array


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


def test_the_pool_hands_a_buffer_out_again_only_once_nothing_holds_it():
    pool = BufferPool(min_bytes=1 << 20, max_buffers=4)
    first = torch.from_numpy(pool.take(3 << 20))
    address = first.data_ptr()
    first.fill_(7)
    view = first[10:20].view(torch.int16)  # a decoded field: a view of a view
    del first
    second = pool.take(3 << 20)
    second[:] = 0
    assert view.tolist() == [0x0707] * 5, "a held view's buffer was handed out again"
    del view
    assert pool.take(2 << 20).ctypes.data == address, "a released buffer was not reused"
    assert second.ctypes.data != address
    assert pool.take(100).nbytes == 100  # below min_bytes: a fresh array of its own


def test_a_pool_without_huge_pages_recycles_plain_arrays_of_its_size_class():
    """The gloo lanes' frames: plain arrays (no 2 MiB page committed for a header), recycled once dropped."""
    pool = BufferPool(min_bytes=1 << 20, max_buffers=2, huge_pages=False)
    frame = pool.take(1 << 20)
    assert frame.nbytes == frame.base.nbytes == 1 << 20  # exactly the size class: no huge-page padding
    address = frame.ctypes.data
    held = torch.from_numpy(frame[:100])  # a message handed over in the frame
    del frame
    other = pool.take(1 << 20)
    assert other.ctypes.data != address, "a frame still held was handed out again"
    del held
    assert pool.take(1 << 20).ctypes.data == address, "a released frame was not reused"
    assert other.base.nbytes == 1 << 20


def test_pooled_buffers_start_on_a_huge_page_boundary_and_are_backed_by_huge_pages():
    pool = BufferPool()
    for nbytes in (1 << 20, (5 << 20) + 3, 16 << 20):
        assert pool.take(nbytes).ctypes.data % HUGE_PAGE == 0
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("transparent huge pages are off on this machine: nothing backs a buffer with them")
    buffer = pool.take(4 << 20)
    buffer[:] = 1  # pages are committed where written
    mapping = _mapping_of(buffer.ctypes.data)
    assert "hg" in mapping["VmFlags"].split(), f"the mapping was not advised to use huge pages: {mapping}"
    assert int(mapping["AnonHugePages"].split()[0]) >= HUGE_PAGE // 1024, (
        f"no huge page behind a pooled buffer ({mode.read_text().strip()}): {mapping}"
    )


def _mapping_of(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping of this process that holds ``address``."""
    fields: dict[str, str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and not head.endswith(":"):
            if fields is not None:
                return fields
            start, end = (int(part, 16) for part in head.split("-"))
            fields = {} if start <= address < end else None
        elif fields is not None:
            fields[head.rstrip(":")] = rest.strip()
    if fields is not None:
        return fields
    raise AssertionError(f"no mapping holds {address:#x}")
