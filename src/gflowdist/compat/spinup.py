"""Spinning Up's ``spinup.utils.mpi_tools`` and ``spinup.utils.mpi_pytorch``, over gflowdist.

    from spinup.utils.mpi_tools import mpi_fork, proc_id, mpi_avg, num_procs   # before
    from gflowdist.compat.spinup import mpi_fork, proc_id, mpi_avg, num_procs  # after

Same names and signatures (each takes an extra optional ``group``: a
gflowdist communicator, an mpi4py communicator or a torch process group); works
under mpiexec, under torch.distributed and as a plain process. Fixed here:

- ``mpi_fork`` also detects a job started by ``mpiexec`` itself (not only
  ``IN_MPI``), keeps ``-m module``, exits with the job's status;
- ``mpi_statistics_scalar`` flattens multi-dimensional input (the original
  counts rows), accepts ranks without samples;
- ``mpi_avg_grads`` skips parameters without a gradient (the original
  crashes) and reduces once per flat bucket instead of once per parameter.
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
    """Reduce a scalar, list, array or CPU tensor as float32; a scalar in gives a numpy float32 scalar out."""
    scalar = np.isscalar(x) or (isinstance(x, (np.ndarray, torch.Tensor)) and x.ndim == 0)
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    buff = np.array(x, dtype=np.float32).reshape(-1) if scalar else np.array(x, dtype=np.float32)
    group_or_world(group).all_reduce(buff, as_reduce_op(op))
    return buff[0] if scalar else buff


def mpi_sum(x: Any, group: Group | None = None) -> Any:
    """Sum over ranks (see :func:`mpi_op`)."""
    return mpi_op(x, ReduceOp.SUM, group)


def mpi_avg(x: Any, group: Group | None = None) -> Any:
    """Mean over ranks of a scalar, list, array or CPU tensor, as float32 (scalar in, scalar out)."""
    return mpi_sum(x, group) / num_procs(group)


def mpi_statistics_scalar(x: Any, with_min_and_max: bool = False, group: Group | None = None) -> tuple:
    """Pooled mean and population std (ddof 0) of every rank's samples; optionally global min and max.

    See :mod:`gflowdist.ops.statistics` for the formulas; ranks may hold
    different numbers of samples or none.
    """
    return statistics_scalar(x, with_min_and_max, group)


def setup_pytorch_for_mpi(group: Group | None = None) -> None:
    """Give torch ``max(int(threads / world), 1)`` threads when it has more than one."""
    share_torch_threads(num_procs(group))


def mpi_avg_grads(module: torch.nn.Module, group: Group | None = None) -> None:
    """Average every parameter's gradient over the ranks, in place; ``None`` gradients are skipped."""
    average_gradients(module, group)


def sync_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Broadcast every parameter from rank 0, in place."""
    _sync_params(module, group)
