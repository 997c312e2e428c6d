"""torchgfn's ``gfn.utils.distributed``, on gflowdist: change the import, keep the calls.

    # from gfn.utils.distributed import initialize_distributed_compute, send, recv
    from gflowdist.compat.torchgfn import initialize_distributed_compute, send, recv

Every public name of the original, with the same parameters:
:class:`DistributedContext`, :class:`DistributedContextMPI4Py`,
:class:`AsyncSendHandle`, :class:`RankLayout` (torchgfn's releases after
2.4.1), :func:`initialize_distributed_compute`,
:func:`initialize_distributed_compute_mpi4py`, :func:`send`, :func:`isend`,
:func:`recv`, :func:`barrier`, :func:`get_rank`, :func:`get_world_size`,
:func:`all_reduce`, :func:`all_gather`, :func:`broadcast`,
:func:`gather_distributed_data`, :func:`average_gradients`,
:func:`average_models`, :func:`report_load_imbalance`, :func:`report_time_info`.

``backend`` is ``"mpi"`` (the default, as in torchgfn) or ``"torch"``; with
``group=None`` it picks that engine's world communicator
(:func:`~gflowdist.compat.torchgfn_groups.world_for`). Any other ``group``
decides the engine itself: a torch.distributed process group or an mpi4py
communicator — the contexts' groups, or one the user built with
``dist.new_group`` or ``MPI.COMM_WORLD.Split`` / ``Create`` — or a gflowdist
:class:`~gflowdist.comm.Communicator`. Native groups are wrapped once and
cached (:mod:`gflowdist.comm.native`). Without any launcher everything is a
world of one: sends to rank 0 loop back, collectives return what a 1-rank
job returns.

Fixed behaviour (each has a test in tests/ranked/test_compat_torchgfn.py):

- averages divide by the size of the group they run over,
  ``p <- (1/n) sum_{r in group} p_r`` with ``n = |group|`` (torchgfn divides
  by the world size, so averaging over a sub-group shrank the weights);
- ``initialize_distributed_compute_mpi4py`` needs no torch.distributed;
- ``cleanup()`` never raises and may be called twice;
- never pickle on the wire: a flat uint8 tensor (what torchgfn sends) goes
  out as its own bytes, with no envelope and no copy, marked as such by the
  message's kind (:meth:`~gflowdist.comm.Communicator.recv_kind`); any other
  value (tensors of any dtype and shape, plain Python values) as a gflowdist
  wire message (msgpack header + raw array frames);
- ``broadcast(src=...)`` is a rank *of the group* on both backends (torchgfn's
  torch path took a global rank, its MPI path a group rank);
- the torch path files every message under its channel tag from a header
  sent ahead of it, so channels stay apart where NCCL ignores tags.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from gflowdist.comm import AsyncSendHandle, Communicator
from gflowdist.comm.native import Group, rank_and_size
from gflowdist.compat.per_tensor import average_each, needs_per_tensor
from gflowdist.compat.torchgfn_context import (
    DistributedContext,
    DistributedContextMPI4Py,
    DistributedContextmpi4py,
    initialize_distributed_compute,
    initialize_distributed_compute_mpi4py,
)
from gflowdist.compat.torchgfn_groups import engine_of, known_world, resolve_group, world_for
from gflowdist.compat.torchgfn_layout import RankLayout
from gflowdist.timing import report_load_imbalance, report_time_info
from gflowdist.transport import EncodeError, MessageType, decode, encode

__all__ = [
    "AsyncSendHandle",
    "DistributedContext",
    "DistributedContextMPI4Py",
    "DistributedContextmpi4py",
    "Group",
    "RankLayout",
    "all_gather",
    "all_reduce",
    "average_gradients",
    "average_models",
    "barrier",
    "broadcast",
    "default_backend",
    "gather_distributed_data",
    "get_rank",
    "get_world_size",
    "initialize_distributed_compute",
    "initialize_distributed_compute_mpi4py",
    "isend",
    "recv",
    "report_load_imbalance",
    "report_time_info",
    "send",
    "world_for",
]


default_backend = "mpi"

_SEQ = itertools.count()
#: Message kinds (:meth:`Communicator.recv_kind`): a gflowdist wire message, or a uint8
#: tensor's own bytes. A plain ``Communicator.send`` is kind 0, so bytes that did not come
#: from :func:`send` are decoded, and refused with a ProtocolError, never taken as a tensor.
_ENCODED, _RAW = 0, 1
_UINT8 = torch.uint8


def _is_raw(data: Any) -> bool:
    """A 1-D uint8 tensor travels as its bytes (the communicator makes it contiguous if needed)."""
    return type(data) is torch.Tensor and data.dtype is _UINT8 and data.ndim == 1


# -- point to point -------------------------------------------------------------------------


def _world_of(backend: str, what: str) -> Communicator:
    # the world a backend name resolved to before (the names are the engines' names), without the
    # three calls of resolve_group on every message
    known = known_world(backend) if type(backend) is str else None
    return known if known is not None else resolve_group(backend, None, what)


def _encode(data: Any, sender: int, dst_rank: int):
    try:
        return encode(MessageType.USER, data, sender=sender, seq=next(_SEQ))
    except EncodeError as err:
        raise EncodeError(
            f"send to rank {dst_rank}: {err}. gflowdist never pickles: send tensors and plain values "
            "(e.g. {'message_type': 'DATA', 'message_data': {...}}) instead of Message.serialize() "
            "(docs/migration-torchgfn.md)"
        ) from err


def send(data: Any, dst_rank: int, backend: str = default_backend, tag: int = 0) -> None:
    """Send ``data`` to world rank ``dst_rank`` on channel ``tag``; returns once the buffer is free.

    ``data`` is what torchgfn sends (a uint8 tensor of bytes) or any value the
    wire carries: tensors and numpy arrays of any supported dtype (they arrive
    with their dtype and shape), None, bool, int, float, str, bytes, lists,
    tuples and dicts with str keys of these. Anything else raises
    :class:`~gflowdist.transport.EncodeError` before anything is sent.
    Messages from one sender on one tag arrive in order. A send to this rank
    itself returns at once: it could not complete before this same thread
    receives it (a blocking MPI send to oneself never returns).
    """
    comm = known_world(backend) if type(backend) is str else None  # _world_of, inline: once per message
    if comm is None:
        comm = _world_of(backend, "send")
    if type(data) is torch.Tensor and data.dtype is _UINT8 and data.ndim == 1:  # _is_raw, inline
        comm.send(data, dst_rank, tag, kind=_RAW)  # to this rank itself: looped back, at once
    else:
        comm.send(_encode(data, comm.rank, dst_rank), dst_rank, tag, kind=_ENCODED)


def isend(data: Any, dst_rank: int, backend: str = default_backend, tag: int = 0) -> AsyncSendHandle:
    """Start sending ``data`` (as :func:`send`) and return at once.

    The handle owns the encoded message until the send completes: poll
    ``handle.is_complete()`` or block in ``handle.wait(timeout=None)``.
    Dropping the handle does not cancel the send.
    """
    comm = _world_of(backend, "isend")
    if _is_raw(data):
        return comm.isend(data, dst_rank, tag, kind=_RAW)
    return comm.isend(_encode(data, comm.rank, dst_rank), dst_rank, tag, kind=_ENCODED)


def recv(
    src_rank: int | None = None, backend: str = default_backend, tag: int = 0, *, timeout: float | None = None
) -> tuple[int, Any]:
    """Receive one message on ``tag`` from ``src_rank`` (None: any rank): ``(source rank, data)``.

    ``data`` is what the sender passed to :func:`send` (a uint8 tensor stays a
    uint8 tensor; a tuple arrives as a list). Waits without spinning a core;
    with ``timeout`` (seconds) raises :class:`~gflowdist.errors.DeadlineError`
    and loses nothing. Bytes that are not a gflowdist message raise
    :class:`~gflowdist.errors.ProtocolError` naming the sender.
    """
    comm = known_world(backend) if type(backend) is str else None  # _world_of, inline: once per message
    if comm is None:
        comm = _world_of(backend, "recv")
    source, payload, kind = comm.recv_kind(src_rank, tag, timeout=timeout)
    if kind == _RAW:
        return source, payload
    return source, decode(payload, sender=source, expected_types=(MessageType.USER,)).body


# -- collectives ----------------------------------------------------------------------------


def barrier(backend: str = default_backend, group: Group | None = None) -> None:
    """Wait until every rank of ``group`` (None: the world of ``backend``) arrives."""
    resolve_group(backend, group, "barrier").barrier()


def get_rank(backend: str = default_backend, group: Group | None = None) -> int:
    """This rank's rank in ``group`` (None: the world of ``backend``); -1 if not a member. No communication."""
    if group is None:
        return resolve_group(backend, None, "get_rank").rank
    engine_of(backend)
    return rank_and_size(group)[0]


def get_world_size(backend: str = default_backend, group: Group | None = None) -> int:
    """The number of ranks in ``group`` (None: the world of ``backend``); -1 if not a member. No communication."""
    if group is None:
        return resolve_group(backend, None, "get_world_size").size
    engine_of(backend)
    return rank_and_size(group)[1]


def all_reduce(
    tensor: torch.Tensor, op: Any = "SUM", backend: str = default_backend, group: Group | None = None
) -> None:
    """Reduce ``tensor`` over ``group`` in place.

    ``op``: ``"SUM"``, ``"MAX"``, ``"MIN"`` (torchgfn's) or ``"AVG"``, which is
    ``(1/n) sum_r x_r`` with ``n`` the size of ``group`` (floating point only);
    torch's and mpi4py's op objects are accepted too.
    """
    from gflowdist.ops import as_reduce_op

    reduce_op = as_reduce_op(op)
    resolve_group(backend, group, "all_reduce").all_reduce(tensor.detach(), reduce_op)


def all_gather(
    output_list: list[torch.Tensor], tensor: torch.Tensor, backend: str = default_backend, group: Group | None = None
) -> None:
    """Fill ``output_list[r]`` with rank ``r``'s ``tensor``, for every rank ``r`` of ``group``.

    Every rank passes a tensor of the same shape and dtype, and one
    pre-allocated tensor of that shape per rank of the group.
    """
    comm = resolve_group(backend, group, "all_gather")
    if len(output_list) != comm.size:
        raise ValueError(
            f"all_gather: output_list holds {len(output_list)} tensors but the group has {comm.size} ranks"
        )
    parts = comm.all_gather(tensor.detach())
    for rank, (out, part) in enumerate(zip(output_list, parts, strict=False)):
        if out.shape != part.shape:
            raise ValueError(
                f"all_gather: output_list[{rank}] has shape {tuple(out.shape)}, rank {rank} sent {tuple(part.shape)}"
            )
        out.detach().copy_(part)


def broadcast(tensor: torch.Tensor, src: int, backend: str = default_backend, group: Group | None = None) -> None:
    """Overwrite ``tensor`` on every rank of ``group`` with rank ``src``'s, in place.

    ``src`` is a rank **of the group** (0 = its first member) on both
    backends; for ``group=None`` group ranks are world ranks.
    """
    resolve_group(backend, group, "broadcast").broadcast(tensor.detach(), src)


def gather_distributed_data(
    local_tensor: torch.Tensor,
    world_size: int | None = None,
    rank: int | None = None,
    training_group: Group | None = None,
) -> torch.Tensor | None:
    """Every rank's rows, concatenated in rank order on rank 0 of ``training_group``; None elsewhere.

    ``training_group`` None is the job's world. Ranks may hold different
    numbers of rows (zero too); the other dimensions (any number of them, not
    only torchgfn's one) and the dtype must agree. ``world_size`` and
    ``rank``, when given, must be the group's size and this rank's rank in the
    group (torchgfn took them on trust).
    """
    from gflowdist.ops import gather_distributed_data as gather_rows

    comm = _group_or_job_world(training_group, "gather_distributed_data")
    if world_size is not None and world_size != comm.size:
        raise ValueError(f"gather_distributed_data: world_size={world_size} but the group has {comm.size} ranks")
    if rank is not None and rank != comm.rank:
        raise ValueError(f"gather_distributed_data: rank={rank} but this process is rank {comm.rank} of the group")
    return gather_rows(local_tensor, group=comm, dst=0)


# -- averaging ------------------------------------------------------------------------------


def _group_or_job_world(group: Group | None, what: str) -> Communicator:
    """``group`` resolved, or the job's world (torchgfn used torch.distributed's default group)."""
    if group is None:
        from gflowdist.comm import world_comm

        return world_comm()
    return resolve_group(default_backend, group, what)


def average_gradients(model: torch.nn.Module, group: Group | None = None) -> None:
    """Replace every gradient by its mean over ``group`` (None: the job's world), in place.

    ``g <- (1/n) sum_{r in group} g_r`` with ``n`` the group's size (as
    torchgfn: ``sum / n``, the same bits), in one flat reduction per bucket
    (:func:`gflowdist.ops.average_gradients`), or tensor by tensor on gloo
    with 3 or more ranks, where a flat buffer would change the last bits
    (``gflowdist.compat.per_tensor``). Parameters without a gradient on
    every rank keep ``grad = None`` (torchgfn's crashed on them).
    """
    from gflowdist.ops import average_gradients as average

    comm = _group_or_job_world(group, "average_gradients")
    if not needs_per_tensor(comm):
        average(model, comm)
        return
    params = [p for p in model.parameters() if p.requires_grad]
    for p, grad in zip(params, average_each([p.grad for p in params], params, comm), strict=True):
        if p.grad is None and grad is not None:
            p.grad = grad


def average_models(model: torch.nn.Module, training_group: Group | None = None) -> None:
    """Replace every parameter by its mean over ``training_group`` (None: the job's world), in place.

    ``p <- (1/n) sum_{r in group} p_r`` with ``n`` the size of *that* group:
    identical models stay identical (torchgfn divided by the world size).
    Per bucket, or tensor by tensor on gloo with 3 or more ranks (as
    :func:`average_gradients`).
    """
    from gflowdist.ops import average_models as average

    comm = _group_or_job_world(training_group, "average_models")
    if not needs_per_tensor(comm):
        average(model, comm)
        return
    params = list(model.parameters())
    average_each([p.data for p in params], params, comm)
