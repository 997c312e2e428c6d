"""Flat buckets: many tensors moved by one collective instead of one each.

A collective costs a fixed latency plus bytes / bandwidth; reducing 100
small tensors one by one pays the latency 100 times. :func:`plan_buckets`
groups tensors by ``(dtype, device)`` (a collective has one dtype) and cuts
each group, in order, into buckets of at most ``cap_bytes`` (a single larger
tensor gets a bucket of its own). :func:`reduce_tensors` and
:func:`broadcast_tensors` then run one collective per bucket on a
concatenated copy and write the results back.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from gflowdist.comm.base import Communicator, ReduceOp, require_float_for_avg

__all__ = ["DEFAULT_BUCKET_CAP_BYTES", "plan_buckets", "reduce_tensors", "broadcast_tensors"]

#: Largest bucket by default (bytes). MPI counts are 32-bit ints; this stays far below.
DEFAULT_BUCKET_CAP_BYTES = 128 << 20


def plan_buckets(tensors: Sequence[torch.Tensor], cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> list[list[int]]:
    """Indices of ``tensors`` in buckets: same dtype and device, in order, at most ``cap_bytes`` each."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be a positive number of bytes, got {cap_bytes}")
    open_buckets: dict[tuple, tuple[list[int], int]] = {}
    closed: list[list[int]] = []
    for index, tensor in enumerate(tensors):
        key = (tensor.dtype, tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        members, used = open_buckets.get(key, ([], 0))
        if members and used + nbytes > cap_bytes:
            closed.append(members)
            members, used = [], 0
        members.append(index)
        open_buckets[key] = (members, used + nbytes)
    closed.extend(members for members, _ in open_buckets.values() if members)
    return sorted(closed, key=lambda bucket: bucket[0])


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _write_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        tensor.detach().copy_(flat[offset:offset + n].view_as(tensor))
        offset += n


def _each_bucket(tensors: Sequence[torch.Tensor], cap_bytes: int, collective: Callable[[torch.Tensor], object]) -> None:
    """Run ``collective`` in place on a flat copy of each bucket, then write the results back."""
    for bucket in plan_buckets(tensors, cap_bytes):
        members = [tensors[i] for i in bucket]
        flat = _flatten(members)
        collective(flat)
        _write_back(flat, members)


def reduce_tensors(tensors: Sequence[torch.Tensor], op: ReduceOp, group: Communicator,
                   cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> None:
    """Reduce every tensor over ``group`` in place, one collective per bucket.

    ``ReduceOp.AVG`` refuses integer tensors with ``TypeError`` before any
    communication. The bucket plan depends only on the tensors' dtypes,
    devices and sizes, so it is the same on every rank whose tensors have the
    same layout.
    """
    if op is ReduceOp.AVG:
        for tensor in tensors:  # refuse before any rank starts a collective
            require_float_for_avg(tensor)
    if group.size > 1:
        _each_bucket(tensors, cap_bytes, lambda flat: group.all_reduce(flat, op))


def broadcast_tensors(tensors: Sequence[torch.Tensor], src: int, group: Communicator,
                      cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> None:
    """Overwrite every tensor with rank ``src``'s, in place, one broadcast per bucket."""
    if group.size > 1:
        _each_bucket(tensors, cap_bytes, lambda flat: group.broadcast(flat, src))
