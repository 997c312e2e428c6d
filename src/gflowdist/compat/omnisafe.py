"""OmniSafe's ``omnisafe.utils.distributed`` (0.3 and 0.5 APIs), over gflowdist.

    from omnisafe.utils import distributed            # before
    from gflowdist.compat import omnisafe as distributed  # after

Same names and signatures (each collective takes an extra optional
``group``), of both releases: 0.3's ``is_master``, ``allreduce`` and
``allgather`` and 0.5's ``all_reduce`` and ``all_gather``; ``fork`` takes
either release's arguments (:func:`fork`; :func:`fork_v03` and
:func:`fork_v05` take exactly one release's). The statistics compute as the
original does (float32, the same reductions), so a seeded run gives the same
bits. Fixed here:

- ``get_rank`` / ``world_size`` / ``is_master`` read the live job (a stray
  ``MASTER_ADDR`` no longer makes them raise);
- ``fork`` translates launcher flags for torchrun instead of passing
  mpirun's (see :mod:`gflowdist.launch.torchrun`);
- ``dist_op`` and friends return a new float32 tensor and never modify
  their input;
- ``avg_tensor`` works on 0-d tensors;
- ``dist_statistics_scalar`` flattens its input (a 0-d input is one
  sample), returns *scalar* global min and max and leaves its input alone;
  ``precise=True`` computes in float64 instead.

OmniSafe also re-exports ``torch.distributed``'s ``reduce``, ``all_reduce``,
``gather``, ``all_gather``, ``broadcast`` and ``scatter``; here they have
torch's signatures but run on the job's communicator (MPI included), with
``group`` a gflowdist :class:`~gflowdist.comm.Communicator` or a torch
process group (or mpi4py communicator). They are
synchronous: ``async_op=True`` returns an already completed handle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.native import Group
from gflowdist.compat.per_tensor import average_each, needs_per_tensor
from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.launch.threads import share_torch_threads
from gflowdist.launch.torchrun import fork as _torchrun_fork
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
    "fork_v03",
    "fork_v05",
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
    "allreduce",
    "gather",
    "all_gather",
    "allgather",
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
    """Give torch ``max(int(threads / world), 1)`` threads when it has more than one; print it as OmniSafe does."""
    before, after = share_torch_threads(world_size(group))
    if after != before:
        print(f"Proc {get_rank(group)}: Decreased number of Torch threads from {before} to {after}", flush=True)


# -- fork: OmniSafe 0.3's and 0.5's signatures -----------------------------------------------


def fork_v03(
    parallel: int,
    bind_to_core: bool = False,
    use_number_of_threads: bool = False,
    device: str = "cpu",
    manual_args: list[str] | None = None,
) -> bool:
    """OmniSafe 0.3's ``fork``: start ``parallel`` workers under torchrun; True in the parent.

    Inside a job (torch or MPI) it sets up the process group if needed and
    returns False; ``parallel <= 1`` returns False. ``bind_to_core`` pins each
    worker to one physical core (one hardware thread with
    ``use_number_of_threads``) instead of passing mpirun's flags to torchrun.
    A failing worker raises :class:`~gflowdist.errors.GflowdistError`.
    """
    return _torchrun_fork(parallel, bind_to_core, use_number_of_threads, device, manual_args)


def _visible_devices(parallel: int, device: str) -> None:
    """OmniSafe 0.5's device set-up for the workers (``CUDA_VISIBLE_DEVICES``, ``USE_DISTRIBUTED``)."""
    try:
        first = int(device.split(":")[-1])
    except ValueError:
        raise ConfigError(f"fork: device {device!r} names no device index (e.g. 'cuda:0')", key="device") from None
    os.environ["USE_DISTRIBUTED"] = "1"
    if os.getenv("CUDA_VISIBLE_DEVICES") is None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(parallel))
    visible = [d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    if len(visible) < parallel:
        raise GflowdistError(
            f"fork({parallel}, device={device!r}): CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} "
            f"lists {len(visible)} device(s), fewer than the {parallel} workers"
        )


def fork_v05(parallel: int, device: str = "cpu", manual_args: list[str] | None = None) -> bool:
    """OmniSafe 0.5's ``fork``: as :func:`fork_v03`, and a CUDA ``device`` spreads the workers.

    With ``device`` not ``'cpu'`` (``'cuda:K'``) and ``CUDA_VISIBLE_DEVICES``
    unset, the workers see devices ``K .. K+parallel-1`` and
    ``USE_DISTRIBUTED=1`` is set, as in OmniSafe 0.5; fewer visible devices
    than workers raise :class:`~gflowdist.errors.GflowdistError` (the original
    asserts, and miscounts two-digit device ids).
    """
    if device != "cpu" and parallel > 1 and os.getenv("MASTER_ADDR") is None:
        _visible_devices(parallel, device)
    return _torchrun_fork(parallel, False, False, device, manual_args)


_V03 = ("bind_to_core", "use_number_of_threads", "device", "manual_args")
_V05 = ("device", "manual_args")


def fork(parallel: int, *args: Any, **kwargs: Any) -> bool:
    """OmniSafe's ``fork``, with 0.3's or 0.5's arguments; the second positional argument decides.

    - ``fork(parallel, bind_to_core=False, use_number_of_threads=False,
      device='cpu', manual_args=None)`` (0.3) when the second positional
      argument is a bool (or any non-string), or when ``bind_to_core`` or
      ``use_number_of_threads`` is passed by keyword;
    - ``fork(parallel, device='cpu', manual_args=None)`` (0.5) when it is a
      string (a device: ``fork(2, 'cuda:0')``).

    With only keywords (``device=``, ``manual_args=``) both releases mean the
    same. :func:`fork_v03` and :func:`fork_v05` take exactly one release's
    signature, for code that wants no detection.
    """
    v03_keywords = {"bind_to_core", "use_number_of_threads"} & kwargs.keys()
    names: tuple[str, ...]
    target: Callable[..., bool]
    if (args and isinstance(args[0], str)) and not v03_keywords:
        names, target = _V05, fork_v05
    else:
        names, target = _V03, fork_v03
    if len(args) > len(names):
        raise TypeError(f"fork() takes at most {len(names) + 1} positional arguments ({len(args) + 1} given)")
    for name, _ in zip(names, args, strict=False):
        if name in kwargs:
            raise TypeError(f"fork() got multiple values for argument '{name}'")
    unknown = set(kwargs) - set(names)
    if unknown:
        raise TypeError(f"fork() got an unexpected keyword argument '{sorted(unknown)[0]}'")
    return target(parallel, **dict(zip(names, args, strict=False)), **kwargs)


def avg_grads(module: torch.nn.Module, group: Group | None = None) -> None:
    """Average every gradient over the job, in place (``sum / n``); ``None`` gradients are skipped.

    One flat reduction per bucket, except on gloo with 3 or more ranks, where
    each gradient is reduced on its own as OmniSafe does (see
    ``gflowdist.compat.per_tensor``), so the bits are the original's everywhere.
    """
    comm = group_or_world(group)
    if not needs_per_tensor(comm):
        average_gradients(module, comm)
        return
    params = [p for p in module.parameters() if p.requires_grad]
    for p, grad in zip(params, average_each([p.grad for p in params], params, comm), strict=True):
        if p.grad is None and grad is not None:
            p.grad = grad


def sync_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Broadcast every parameter from rank 0, in place."""
    _sync_params(module, group)


def avg_params(module: torch.nn.Module, group: Group | None = None) -> None:
    """Replace every parameter by its mean over the job (``sum / n``), in place.

    Per bucket, or per parameter on gloo with 3 or more ranks (as :func:`avg_grads`).
    """
    comm = group_or_world(group)
    if not needs_per_tensor(comm):
        average_models(module, comm)
        return
    params = list(module.parameters())
    average_each([p.data for p in params], params, comm)


def dist_statistics_scalar(
    value: Any, with_min_and_max: bool = False, group: Group | None = None, *, precise: bool = False
) -> tuple[torch.Tensor, ...]:
    """Pooled ``(mean, std)`` or ``(mean, std, min, max)`` of all ranks' samples as 0-d float32 tensors.

    As OmniSafe computes them, so the bits are the original's: ``sum`` and
    ``n`` each summed over the ranks as float32, ``mean = sum / n``, then
    ``sum((x - mean)**2)`` summed and ``std = sqrt(sum_sq / n)`` (population
    std, ddof 0), in torch, in the input's dtype. Ranks may hold different
    numbers of samples or none; input of any shape is flattened (a 0-d value
    is one sample); the input is never modified. min and max are *scalar*
    global extremes (+inf / -inf from a rank without samples).

    ``precise=True`` computes in float64 with a pairwise combine instead
    (:func:`gflowdist.ops.statistics_scalar`), returned as float32 tensors.
    """
    if precise:
        stats = statistics_scalar(value, with_min_and_max, group)
        return tuple(torch.tensor(s, dtype=torch.float32) for s in stats)
    x = (value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)).reshape(-1)
    global_sum = dist_sum(torch.sum(x), group)
    global_n = dist_sum(torch.tensor(len(x)).to(x.device), group)
    mean = global_sum / global_n
    global_sum_sq = dist_sum(torch.sum((x - mean) ** 2), group)
    std = torch.sqrt(global_sum_sq / global_n)
    if with_min_and_max:
        inf = torch.tensor(float("inf"), device=x.device)
        global_min = dist_min(torch.min(x) if len(x) else inf, group)
        global_max = dist_max(torch.max(x) if len(x) else -inf, group)
        return mean, std, global_min, global_max
    return mean, std


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


#: OmniSafe 0.3's names of ``all_reduce`` and ``all_gather``.
allreduce = all_reduce
allgather = all_gather
