"""Tensor collectives over any group: reductions that return new tensors, in-place averages, gathers.

Every function takes ``group``: a :class:`~gflowdist.comm.Communicator` (a
sub-group from :meth:`~gflowdist.comm.Communicator.split`, say), a native
group (a torch.distributed process group, an mpi4py communicator) or None
for the whole job (:func:`gflowdist.comm.world_comm`). Ranks are ranks of that
group: ``broadcast(x, src=0, group=g)`` broadcasts from ``g``'s first member.
Without any launcher the world is one process and every answer is the one a
1-rank job gives (a sum over one rank is the value itself).

Reductions:

- :func:`dist_op` and ``dist_sum / dist_max / dist_min / dist_avg`` return a
  **new** tensor (float32 unless ``dtype`` says otherwise) holding, element by
  element, ``sum_r x_r``, ``max_r x_r``, ``min_r x_r`` or
  ``(1/n) * sum_r x_r`` over the ``n`` ranks of the group. The input is never
  modified. A Python or numpy scalar gives a 0-d tensor.
- :func:`avg_tensor` replaces a floating-point tensor by its mean over the
  group, in place (0-d tensors included).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch

from gflowdist.comm.base import Communicator, ReduceOp
from gflowdist.comm.native import Group, as_communicator
from gflowdist.comm.native import rank_and_size as native_rank_and_size

__all__ = [
    "group_or_world",
    "rank_and_size",
    "as_reduce_op",
    "dist_op",
    "dist_sum",
    "dist_max",
    "dist_min",
    "dist_avg",
    "avg_tensor",
    "all_gather",
    "broadcast",
    "barrier",
    "gather_distributed_data",
]


def group_or_world(group: Any, what: str = "this call") -> Communicator:
    """The communicator of ``group``, or the job's world communicator when None.

    ``group`` may be a gflowdist :class:`Communicator` or a native group: a
    torch.distributed process group or an mpi4py communicator, the user's
    own included (:func:`gflowdist.comm.native.as_communicator`: wrapped once
    and cached). A non-member's handle (``NON_GROUP_MEMBER``,
    ``MPI.COMM_NULL``) raises :class:`~gflowdist.comm.native.NotAMemberError`
    naming ``what``.
    """
    if group is None:
        from gflowdist.comm.select import world_comm

        return world_comm()
    return as_communicator(group, what)


def rank_and_size(group: Any = None) -> tuple[int, int]:
    """This rank's rank in ``group`` (None: the job's world) and its size, without communicating.

    A non-member's handle of a native group gives ``(-1, -1)``, as
    ``torch.distributed.get_rank(group)`` does.
    """
    if group is None:
        world = group_or_world(None)
        return world.rank, world.size
    return native_rank_and_size(group)


_BY_NAME = {op.value: op for op in ReduceOp}


def as_reduce_op(op: Any) -> ReduceOp:
    """A :class:`ReduceOp` from what the original libraries pass.

    Accepts a :class:`ReduceOp`, a name (``"sum"``, ``"max"``, ``"min"``,
    ``"avg"``, any case), ``torch.distributed.ReduceOp.SUM/MAX/MIN/AVG`` and
    mpi4py's ``MPI.SUM/MAX/MIN``. Anything else raises ``ValueError``.
    """
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.lower() in _BY_NAME:
        return _BY_NAME[op.lower()]
    name = getattr(op, "name", None)  # torch.distributed.ReduceOp.RedOpType members
    if isinstance(name, str) and name.lower() in _BY_NAME and type(op).__module__.startswith("torch"):
        return _BY_NAME[name.lower()]
    mpi = sys.modules.get("mpi4py.MPI")  # only if the caller already uses mpi4py
    if mpi is not None and isinstance(op, mpi.Op):
        for candidate, ours in ((mpi.SUM, ReduceOp.SUM), (mpi.MAX, ReduceOp.MAX), (mpi.MIN, ReduceOp.MIN)):
            if op == candidate:
                return ours
    raise ValueError(f"unsupported reduction {op!r}: use sum, max, min or avg")


def _fresh(value: Any, dtype: torch.dtype) -> torch.Tensor:
    """A new tensor holding ``value`` (never a view of the caller's data)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype=dtype, copy=True)
    return torch.tensor(np.asarray(value), dtype=dtype)


def dist_op(value: Any, op: Any, group: Group | None = None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``op`` over the group of ``value`` (scalar, list, array or tensor), as a new tensor.

    The result has ``value``'s shape (a scalar gives a 0-d tensor), dtype
    ``dtype`` and, for a tensor, its device. ``value`` is left untouched.
    """
    reduce_op = as_reduce_op(op)
    out = _fresh(value, dtype)
    return group_or_world(group).all_reduce(out, reduce_op)


def dist_sum(value: Any, group: Group | None = None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``sum_r value_r`` as a new tensor (see :func:`dist_op`)."""
    return dist_op(value, ReduceOp.SUM, group, dtype=dtype)


def dist_max(value: Any, group: Group | None = None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``max_r value_r`` element-wise, as a new tensor (see :func:`dist_op`)."""
    return dist_op(value, ReduceOp.MAX, group, dtype=dtype)


def dist_min(value: Any, group: Group | None = None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``min_r value_r`` element-wise, as a new tensor (see :func:`dist_op`)."""
    return dist_op(value, ReduceOp.MIN, group, dtype=dtype)


def dist_avg(value: Any, group: Group | None = None, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(1/n) sum_r value_r`` over the ``n`` ranks of the group, as a new tensor."""
    return dist_op(value, ReduceOp.AVG, group, dtype=dtype)


def avg_tensor(tensor: torch.Tensor, group: Group | None = None) -> None:
    """Replace ``tensor`` by its mean over the group, in place (0-d tensors too).

    Integer tensors raise ``TypeError`` before any communication (their mean
    cannot be stored in place).
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"avg_tensor works in place on a torch.Tensor, not {type(tensor).__name__}")
    group_or_world(group).all_reduce(tensor.data, ReduceOp.AVG)


def all_gather(value: Any, group: Group | None = None) -> list:
    """Every rank's ``value`` in rank order (same shape and dtype on every rank).

    Tensors and numpy arrays come back as the same kind; scalars and lists
    are gathered as tensors.
    """
    if not isinstance(value, (torch.Tensor, np.ndarray)):
        value = torch.as_tensor(value)
    return group_or_world(group).all_gather(value.detach() if isinstance(value, torch.Tensor) else value)


def broadcast(value: Any, src: int = 0, group: Group | None = None) -> Any:
    """Overwrite ``value`` (tensor or array) with rank ``src``'s, in place; returns ``value``.

    ``src`` is a rank of ``group`` (0 = its first member), on every engine.
    """
    group_or_world(group).broadcast(value.data if isinstance(value, torch.Tensor) else value, src)
    return value


def barrier(group: Group | None = None, timeout: float | None = None) -> None:
    """Wait until every rank of the group arrives; :class:`DeadlineError` after ``timeout`` s."""
    group_or_world(group).barrier(timeout)


def gather_distributed_data(local: Any, group: Group | None = None, dst: int = 0) -> torch.Tensor | None:
    """The ranks' tensors concatenated along dim 0 on ``dst``, in rank order; None on the others.

    First dimensions may differ between ranks (zero rows too); the other
    dimensions and the dtype must agree, else every rank raises the same
    ``ValueError``. A 0-d tensor counts as one row. Costs two collectives: a
    small exchange of shapes, then one gather of tensors padded to the
    longest rank's rows.
    """
    comm = group_or_world(group)
    if not 0 <= dst < comm.size:
        raise ValueError(f"dst={dst} is not a rank of this group (size {comm.size})")
    tensor = local.detach() if isinstance(local, torch.Tensor) else torch.as_tensor(np.asarray(local))
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    meta = {"rows": int(tensor.shape[0]), "tail": list(tensor.shape[1:]), "dtype": str(tensor.dtype)}
    metas = [json.loads(m) for m in comm.all_gather_bytes(json.dumps(meta).encode())]
    if any((m["tail"], m["dtype"]) != (meta["tail"], meta["dtype"]) for m in metas):
        shapes = ", ".join(
            f"rank {r}: ({m['rows']}, {', '.join(map(str, m['tail']))}) {m['dtype']}" for r, m in enumerate(metas)
        )
        raise ValueError(f"gather_distributed_data: ranks disagree on trailing shape or dtype ({shapes})")
    rows = [m["rows"] for m in metas]
    longest = max(rows)
    if longest == 0 or comm.size == 1:
        return tensor.clone() if comm.rank == dst else None
    padded = tensor.new_zeros((longest, *tuple(tensor.shape[1:])))
    padded[: tensor.shape[0]] = tensor
    parts = comm.gather(padded, dst)
    if parts is None:
        return None
    return torch.cat([part[:n] for part, n in zip(parts, rows, strict=False)])
