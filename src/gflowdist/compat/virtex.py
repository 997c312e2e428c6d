"""VirTex's ``virtex.utils.distributed``, over gflowdist.

    from virtex.utils import distributed as dist        # before
    from gflowdist.compat import virtex as dist         # after

Same names and signatures. Fixed here:

- ``launch`` runs on CPU with gloo (the original insists on NCCL), raises
  with a failing worker's traceback, and never nests inside a running job;
  ``dist_url="auto"`` picks a free port (see :mod:`gflowdist.launch.spawn`);
- ``average_across_processes`` accepts nested dicts and refuses integer
  tensors with ``TypeError`` *before* any communication (the original left
  them holding the sum); all tensors travel in one flat reduction.
"""

from __future__ import annotations

from typing import Any

import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.native import Group
from gflowdist.launch.spawn import launch
from gflowdist.ops.buckets import reduce_tensors
from gflowdist.ops.collectives import group_or_world, rank_and_size
from gflowdist.ops.trees import tree_leaves

__all__ = [
    "launch",
    "synchronize",
    "get_world_size",
    "get_rank",
    "is_master_process",
    "average_across_processes",
    "gpu_mem_usage",
]


def synchronize(group: Group | None = None) -> None:
    """Barrier over the job; nothing to wait for in a world of one."""
    comm = group_or_world(group)
    if comm.size > 1:
        comm.barrier()


def get_world_size(group: Group | None = None) -> int:
    """Number of processes in the job (1 without one)."""
    return rank_and_size(group)[1]


def get_rank(group: Group | None = None) -> int:
    """Rank of this process (0 without a job)."""
    return rank_and_size(group)[0]


def is_master_process(group: Group | None = None) -> bool:
    """True on rank 0."""
    return get_rank(group) == 0


def average_across_processes(t: torch.Tensor | dict[str, Any], group: Group | None = None) -> None:
    """Replace a tensor, or every tensor of a (nested) dict, by its mean over the job, in place.

    Every leaf must be a floating-point tensor; anything else raises
    ``TypeError`` on the calling rank before any rank communicates.
    """
    leaves = tree_leaves(t)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor) or not leaf.is_floating_point():
            what = f"a {leaf.dtype} tensor" if isinstance(leaf, torch.Tensor) else f"a {type(leaf).__name__}"
            raise TypeError(f"average_across_processes averages floating-point tensors in place, got {what}")
    reduce_tensors(leaves, ReduceOp.AVG, group_or_world(group))


def gpu_mem_usage() -> int:
    """Peak memory allocated on the current CUDA device, in MiB; 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.max_memory_allocated() // 1024 // 1024
