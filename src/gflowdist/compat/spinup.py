"""Spinning Up's ``spinup.utils.mpi_tools`` and ``spinup.utils.mpi_pytorch``, over gflowdist.

    from spinup.utils.mpi_tools import mpi_fork, proc_id, mpi_avg, num_procs   # before
    from gflowdist.compat.spinup import mpi_fork, proc_id, mpi_avg, num_procs  # after

Same names and signatures (each takes an extra optional ``group``: a
gflowdist communicator, an mpi4py communicator or a torch process group); works
under mpiexec, under torch.distributed and as a plain process. Fixed here:

- ``mpi_fork`` also detects a job started by ``mpiexec`` itself (not only
  ``IN_MPI``), keeps ``-m module``, exits with the job's status;
- ``mpi_statistics_scalar`` flattens multi-dimensional input (the original
  counts rows) and takes a 0-d input as one sample;
- ``mpi_avg_grads`` skips parameters without a gradient (the original
  crashes), keeps each gradient's dtype (the original reduces in float32)
  and reduces once per flat bucket instead of once per parameter.

Everything else computes as the original does, so a seeded run gives the
same bits: reductions in float32 through the same MPI all-reduce, means as
``sum / n`` (a true division, never a multiplication by ``1/n``), and the
same return types (numpy float32 scalars and arrays).
``mpi_statistics_scalar(..., precise=True)`` (or
:func:`gflowdist.ops.statistics_scalar`) is the better-conditioned float64
computation, offered beside the original's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.native import Group
from gflowdist.launch.mpiexec import mpi_fork
from gflowdist.launch.threads import share_torch_threads
from gflowdist.ops.averaging import average_gradients
from gflowdist.ops.averaging import sync_params as _sync_params
from gflowdist.ops.collectives import as_reduce_op, group_or_world, rank_and_size
from gflowdist.ops.statistics import statistics_scalar

__all__ = [
    "mpi_fork",
    "msg",
    "proc_id",
    "num_procs",
    "allreduce",
    "broadcast",
    "mpi_op",
    "mpi_sum",
    "mpi_avg",
    "mpi_statistics_scalar",
    "setup_pytorch_for_mpi",
    "mpi_avg_grads",
    "sync_params",
]


def proc_id(group: Group | None = None) -> int:
    """Rank of this process (0 in a plain process)."""
    return rank_and_size(group)[0]


def num_procs(group: Group | None = None) -> int:
    """Number of ranks (1 in a plain process)."""
    return rank_and_size(group)[1]


def msg(m: Any, string: str = "", group: Group | None = None) -> None:
    """Print ``m`` prefixed with this process's rank."""
    print(f"Message from {proc_id(group)}: {string} \t {m}")


def allreduce(sendbuf: Any, recvbuf: Any, op: Any = "sum", group: Group | None = None) -> None:
    """``recvbuf[...] = reduce(sendbuf)`` over the ranks (arrays or tensors of one shape)."""
    np.copyto(recvbuf, sendbuf) if isinstance(recvbuf, np.ndarray) else recvbuf.copy_(torch.as_tensor(sendbuf))
    group_or_world(group).all_reduce(recvbuf, as_reduce_op(op))


def broadcast(x: Any, root: int = 0, group: Group | None = None) -> None:
    """Overwrite the array or tensor ``x`` with rank ``root``'s, in place."""
    group_or_world(group).broadcast(x.data if isinstance(x, torch.Tensor) else x, root)


def mpi_op(x: Any, op: Any, group: Group | None = None) -> Any:
    """Reduce a scalar, list, array or CPU tensor as float32, as the original does.

    A scalar (``np.isscalar``: a Python or numpy number) gives a numpy
    float32 scalar; anything else (a 0-d array or tensor too) a new float32
    array of its shape. The input is never modified.
    """
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x, scalar = ([x], True) if np.isscalar(x) else (x, False)
    buff = np.array(x, dtype=np.float32)
    group_or_world(group).all_reduce(buff, as_reduce_op(op))
    return buff[0] if scalar else buff


def mpi_sum(x: Any, group: Group | None = None) -> Any:
    """Sum over ranks (see :func:`mpi_op`)."""
    return mpi_op(x, ReduceOp.SUM, group)


def mpi_avg(x: Any, group: Group | None = None) -> Any:
    """Mean over ranks of a scalar, list, array or CPU tensor, as float32 (scalar in, scalar out)."""
    return mpi_sum(x, group) / num_procs(group)


def mpi_statistics_scalar(
    x: Any, with_min_and_max: bool = False, group: Group | None = None, *, precise: bool = False
) -> tuple:
    """Pooled mean and population std (ddof 0) of every rank's samples; optionally global min and max.

    As Spinning Up computes them, so the bits are the original's: the
    samples as float32, ``(sum, n)`` summed over the ranks in one float32
    all-reduce, ``mean = sum / n``, then ``sum((x - mean)**2)`` summed in a
    second one and ``std = sqrt(sum_sq / n)``; min and max by MIN/MAX
    all-reduces (a rank without samples gives +inf / -inf). Returns numpy
    float32 scalars. Ranks may hold different numbers of samples or none;
    input of any shape is flattened (a 0-d value is one sample).

    ``precise=True`` computes in float64 with a pairwise combine of per-rank
    summaries instead (:func:`gflowdist.ops.statistics_scalar`: better
    conditioned when the mean is large next to the spread; Python floats).
    """
    if precise:
        return statistics_scalar(x, with_min_and_max, group)
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    x = np.array(x, dtype=np.float32).reshape(-1)
    global_sum, global_n = mpi_sum([np.sum(x), len(x)], group)
    mean = global_sum / global_n
    global_sum_sq = mpi_sum(np.sum((x - mean) ** 2), group)
    std = np.sqrt(global_sum_sq / global_n)
    if with_min_and_max:
        global_min = mpi_op(np.min(x) if len(x) > 0 else np.inf, ReduceOp.MIN, group)
        global_max = mpi_op(np.max(x) if len(x) > 0 else -np.inf, ReduceOp.MAX, group)
        return mean, std, global_min, global_max
    return mean, std


def setup_pytorch_for_mpi(group: Group | None = None) -> None:
    """Give torch ``max(int(threads / world), 1)`` threads when it has more than one."""
    share_torch_threads(num_procs(group))


def mpi_avg_grads(module: torch.nn.Module, group: Group | None = None) -> None:
    """Average every parameter's gradient over the ranks, in place; ``None`` gradients are skipped.

    Each gradient becomes ``sum_r g_r / n`` (the original's float32 sum, then
    a true division by the number of ranks), so float32 models get the
    original's bits.
    """
    average_gradients(module, group)


def sync_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Broadcast every parameter from rank 0, in place."""
    _sync_params(module, group)
