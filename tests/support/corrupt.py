"""Damage a checkpoint the ways disks and people do (tests of gflowdist.runtime.checkpoints).

Each function damages one file in place and returns a word the loader's
message must contain for that damage.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["truncate", "random_bytes", "garbage_manifest", "nan_into_a_tensor", "DAMAGES"]


def truncate(path: Path) -> str:
    """Cut the file in half, as a crash during a copy would."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "truncated"


def random_bytes(path: Path) -> str:
    """Replace the contents with random bytes of the same length."""
    path.write_bytes(os.urandom(path.stat().st_size))
    return "SHA-256"


def garbage_manifest(path: Path) -> str:
    """Random bytes (not UTF-8, not JSON) in the MANIFEST.json of ``path``'s checkpoint."""
    (path.parent / "MANIFEST.json").write_bytes(b"\xb1\xfe" + os.urandom(64))
    return "not a manifest"


def nan_into_a_tensor(path: Path) -> str:
    """Four float32 NaNs written over the start of the file's largest float32 tensor; it still loads."""
    import torch

    payload = torch.load(path, weights_only=True)
    tensors = [t for t in _tensors(payload) if t.dtype == torch.float32 and t.numel() >= 4]
    target = max(tensors, key=lambda t: t.numel()).contiguous()
    data = bytearray(path.read_bytes())
    where = data.find(target.numpy().tobytes())  # torch stores tensor data uncompressed
    assert where >= 0, "tensor bytes not found in the file"
    data[where : where + 16] = torch.full((4,), float("nan")).numpy().tobytes()
    path.write_bytes(bytes(data))
    return "SHA-256"


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


#: name -> damage, for parametrized tests
DAMAGES = {
    "truncated": truncate,
    "random_bytes": random_bytes,
    "garbage_manifest": garbage_manifest,
    "nan_in_a_tensor": nan_into_a_tensor,
}
