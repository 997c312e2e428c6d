"""OmniSafe's ``omnisafe.utils.distributed`` (v0.3 API), over gflowdist.

    from omnisafe.utils import distributed            # before
    from gflowdist.compat import omnisafe as distributed  # after

Same names and signatures (each collective takes an extra optional
``group``). Fixed here:

- ``get_rank`` / ``world_size`` / ``is_master`` read the live job (a stray
  ``MASTER_ADDR`` no longer makes them raise);
- ``fork`` translates launcher flags for torchrun instead of passing
  mpirun's (see :mod:`gflowdist.launch.torchrun`);
- ``dist_op`` and friends return a new float32 tensor and never modify
  their input;
- ``avg_tensor`` works on 0-d tensors;
- ``dist_statistics_scalar`` uses the population std over uneven or empty
  ranks, counts a 0-d input as one sample, returns *scalar* global min and
  max and leaves its input alone.

OmniSafe also re-exports ``torch.distributed``'s ``reduce``, ``all_reduce``,
``gather``, ``all_gather``, ``broadcast`` and ``scatter``; here they have
torch's signatures but run on the job's communicator (MPI included), with
``group`` a gflowdist :class:`~gflowdist.comm.Communicator` or a torch
process group (or mpi4py communicator). They are
synchronous: ``async_op=True`` returns an already completed handle.
"""

from __future__ import annotations

from typing import Any

import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.native import Group
from gflowdist.launch.threads import share_torch_threads
from gflowdist.launch.torchrun import fork
from gflowdist.ops.averaging import average_gradients, average_models
from gflowdist.ops.averaging import sync_params as _sync_params
from gflowdist.ops.collectives import (
    as_reduce_op,
    avg_tensor,
    dist_avg,
    dist_max,
    dist_min,
    dist_op,
    dist_sum,
    group_or_world,
    rank_and_size,
)
from gflowdist.ops.statistics import statistics_scalar

__all__ = [
    "setup_distributed",
    "get_rank",
    "is_master",
    "world_size",
    "fork",
    "avg_tensor",
    "avg_grads",
    "sync_params",
    "avg_params",
    "dist_avg",
    "dist_sum",
    "dist_max",
    "dist_min",
    "dist_op",
    "dist_statistics_scalar",
    "reduce",
    "all_reduce",
    "gather",
    "all_gather",
    "broadcast",
    "scatter",
]


def get_rank(group: Group | None = None) -> int:
    """Rank of this process in the running job (0 without one)."""
    return rank_and_size(group)[0]


def world_size(group: Group | None = None) -> int:
    """Number of processes in the running job (1 without one)."""
    return rank_and_size(group)[1]


def is_master(group: Group | None = None) -> bool:
    """True on rank 0."""
    return get_rank(group) == 0


def setup_distributed(group: Group | None = None) -> None:
    """Give torch ``max(int(threads / world), 1)`` threads when it has more than one; print what changed."""
    before, after = share_torch_threads(world_size(group))
    if after != before:
        print(f"Warning! Set torch number of threads: {before} -> {after} (world of {world_size(group)})", flush=True)


def avg_grads(module: torch.nn.Module, group: Group | None = None) -> None:
    """Average every gradient over the job, in place; ``None`` gradients are skipped."""
    average_gradients(module, group)


def sync_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Broadcast every parameter from rank 0, in place."""
    _sync_params(module, group)


def avg_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Replace every parameter by its mean over the job, in place."""
    average_models(module, group)


def dist_statistics_scalar(
    value: Any, with_min_and_max: bool = False, group: Group | None = None
) -> tuple[torch.Tensor, ...]:
    """Pooled ``(mean, std)`` or ``(mean, std, min, max)`` of all ranks' samples as 0-d float32 tensors.

    Population std (ddof 0); ranks may hold different numbers of samples or
    none; a 0-d input is one sample; min and max are scalars (see
    :mod:`gflowdist.ops.statistics`).
    """
    stats = statistics_scalar(value, with_min_and_max, group)
    return tuple(torch.tensor(s, dtype=torch.float32) for s in stats)


class _Completed:
    """What ``async_op=True`` returns: the operation already ran."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _done(async_op: bool) -> _Completed | None:
    return _Completed() if async_op else None


def all_reduce(
    tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Group | None = None, async_op: bool = False
) -> _Completed | None:
    """``torch.distributed.all_reduce``: reduce ``tensor`` in place over the group."""
    group_or_world(group).all_reduce(tensor.data, as_reduce_op(op))
    return _done(async_op)


def reduce(
    tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM, group: Group | None = None, async_op: bool = False
) -> _Completed | None:
    """``torch.distributed.reduce``: the result lands on ``dst`` (here on every rank, as an all-reduce)."""
    return all_reduce(tensor, op, group, async_op)


def broadcast(tensor: torch.Tensor, src: int, group: Group | None = None, async_op: bool = False) -> _Completed | None:
    """``torch.distributed.broadcast``: overwrite ``tensor`` with rank ``src``'s, in place."""
    group_or_world(group).broadcast(tensor.data, src)
    return _done(async_op)


def all_gather(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Group | None = None, async_op: bool = False
) -> _Completed | None:
    """``torch.distributed.all_gather``: ``tensor_list[r]`` receives rank ``r``'s ``tensor``."""
    for slot, value in zip(tensor_list, group_or_world(group).all_gather(tensor.detach()), strict=True):
        slot.data.copy_(value)
    return _done(async_op)


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> _Completed | None:
    """``torch.distributed.gather``: on ``dst``, ``gather_list[r]`` receives rank ``r``'s ``tensor``."""
    parts = group_or_world(group).gather(tensor.detach(), dst)
    if parts is not None:
        if gather_list is None:
            raise ValueError(f"gather: rank {dst} is the destination and needs a gather_list")
        for slot, value in zip(gather_list, parts, strict=True):
            slot.data.copy_(value)
    return _done(async_op)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
    group: Group | None = None,
    async_op: bool = False,
) -> _Completed | None:
    """``torch.distributed.scatter``: ``tensor`` receives ``scatter_list[rank]`` of rank ``src``.

    Runs as one broadcast of the stacked list (every rank receives all parts).
    """
    comm = group_or_world(group)
    stacked = torch.empty((comm.size, *tuple(tensor.shape)), dtype=tensor.dtype, device=tensor.device)
    if comm.rank == src:
        if scatter_list is None or len(scatter_list) != comm.size:
            raise ValueError(f"scatter: rank {src} is the source and needs a scatter_list of {comm.size} tensors")
        torch.stack([t.detach() for t in scatter_list], out=stacked)
    comm.broadcast(stacked, src)
    tensor.data.copy_(stacked[comm.rank])
    return _done(async_op)
