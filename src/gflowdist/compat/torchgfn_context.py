"""torchgfn's distributed contexts, built on :class:`gflowdist.context.DistributedContext`.

Private helper of :mod:`gflowdist.compat.torchgfn` (import from there). It holds
the two context dataclasses, :class:`DistributedContext` and
:class:`DistributedContextMPI4Py`, with torchgfn's field names, and the two
entry points that build them, :func:`initialize_distributed_compute` and
:func:`initialize_distributed_compute_mpi4py`; the process group the first one
may make (and the context's ``cleanup`` destroys) is
:mod:`gflowdist.compat.torchgfn_process_group`'s.

Rank assignment is torchgfn's (``RankLayout.build`` / ``from_hostnames``),
computed by :func:`gflowdist.layout.plan_layout` with the layout config of
:func:`torchgfn_layout_config`: with ``W`` ranks, ``B`` buffers and ``C``
coordinators (0 or 1), the coordinator is rank ``W-1``; the ``T = W-B-C``
trainers are cut into ``B`` consecutive chunks of ``split(T, B)`` ranks (the
first ``T mod B`` one larger), each followed by its buffer rank; with
``B = 0`` the trainers are ranks ``0..T-1``. Agent groups are ``G``
consecutive slices of ``T/G`` trainers. When ``B`` is a multiple of the number
of hosts, buffers are placed on their trainers' host (node-local); when the
hosts do not allow that, the arithmetic (block) rule applies.

The groups are what torchgfn hands out: on the torch backend
``train_global_group``, ``agent_groups`` and ``buffer_group`` are
``torch.distributed`` process groups (``dist.barrier(group=...)``,
``dist.broadcast(..., group=pg)`` work on them), and the fields of
``dc_mpi4py`` are mpi4py communicators (``Barrier()``, ``Get_size()``,
``Allreduce``, ``allgather``). A rank outside a group holds what torchgfn
gives it: ``GroupMember.NON_GROUP_MEMBER`` or ``MPI.COMM_NULL``. gflowdist's
communicator over each group stays in the context's ``core`` (and every
function of :mod:`gflowdist.compat.torchgfn` finds it from the native group,
:mod:`gflowdist.comm.native`). In a world of one there is no native group:
the groups are None, which every function reads as the world of one.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gflowdist.comm import Communicator, in_mpi_job, launcher_world_size, world_comm
from gflowdist.compat.torchgfn_groups import engine_of, native_handle, torch_initialized, world_for
from gflowdist.compat.torchgfn_layout import as_layout
from gflowdist.compat.torchgfn_process_group import check_dist_backend, init_process_group, release_process_group
from gflowdist.context import DistributedContext as CoreContext
from gflowdist.engines import LOCAL, MPI, TORCH
from gflowdist.errors import ConfigError, GflowdistError, LayoutError
from gflowdist.layout import Layout, Role

__all__ = [
    "DistributedContext",
    "DistributedContextMPI4Py",
    "DistributedContextmpi4py",
    "initialize_distributed_compute",
    "initialize_distributed_compute_mpi4py",
    "torchgfn_layout_config",
]

logger = logging.getLogger(__name__)

# -- layout ---------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"must be an integer {bound}, got {value!r}", key=name)
    return value


def torchgfn_layout_config(
    num_remote_buffers: int, num_agent_groups: int = 1, num_coordinators: int = 0
) -> dict[str, Any]:
    """The gflowdist layout config that reproduces torchgfn's rank assignment.

    Node-local placement when there are buffers (plan it with
    ``fallback_to_block=True``: torchgfn falls back to the arithmetic rule when
    the hosts do not allow it), block placement otherwise.
    """
    buffers = _check_int("num_remote_buffers", num_remote_buffers, 0)
    groups = _check_int("num_agent_groups", num_agent_groups, 1)
    coordinators = _check_int("num_coordinators", num_coordinators, 0, 1)
    return {
        "trainers": "rest",
        "actors": 0,
        "buffers": buffers,
        "coordinator": bool(coordinators),
        "agent_groups": groups,
        "placement": "node-local" if buffers else "block",
    }


_SINGLE_PROCESS = {
    "trainers": 1,
    "actors": 0,
    "buffers": 0,
    "coordinator": False,
    "agent_groups": 1,
    "placement": "block",
}


def _create_core(
    world: Communicator, num_remote_buffers: int, num_agent_groups: int, num_coordinators: int
) -> CoreContext:
    cfg = torchgfn_layout_config(num_remote_buffers, num_agent_groups, num_coordinators)
    if world.size == 1:
        # torchgfn's single-process mode: one trainer, whatever was asked for.
        logger.info("world of one rank: single-process mode (buffers, coordinator and agent groups are ignored)")
        cfg = _SINGLE_PROCESS
    core = CoreContext.create(cfg, comm=world, fallback_to_block=True)
    if world.rank == 0:
        logger.info("rank layout:\n%s", core.layout.describe())
    return core


def _check_arguments(layout: Layout, num_remote_buffers: int, num_agent_groups: int, num_coordinators: int) -> None:
    """A layout passed in must have what the arguments ask for (torchgfn used it without a look)."""
    have = (len(layout.buffers), len(layout.agent_groups), 0 if layout.coordinator is None else 1)
    want = (num_remote_buffers, num_agent_groups, num_coordinators)
    if have != want:
        raise LayoutError(
            "initialize_distributed_compute_mpi4py: the layout passed in differs from the arguments: "
            f"it has {have[0]} buffer(s), {have[1]} agent group(s) and {have[2]} coordinator(s), the call asks "
            f"for {want[0]}, {want[1]} and {want[2]}"
        )


def _core_from_layout(world: Communicator, layout: Layout) -> CoreContext:
    """A gflowdist context over ``layout`` as given (no host names gathered, no planning).

    Collective: every rank checks that all were given the same layout, then
    splits the groups in :meth:`CoreContext.create`'s order.
    """
    mine = json.dumps(layout.to_dict(), sort_keys=True)
    statements = [s.decode() for s in world.all_gather_bytes(mine.encode())]
    if len(set(statements)) > 1:
        differing = [rank for rank, other in enumerate(statements) if other != statements[0]]
        raise LayoutError(f"the layout passed in differs between ranks (ranks {differing} differ from rank 0)")
    comms: dict[str, Communicator | None] = {"world": world}
    comms["trainers"] = world.split([list(layout.trainers)])
    comms["DP"] = world.split([list(group) for group in layout.agent_groups])
    comms["POP"] = world.split([list(layout.pop_ranks)])
    comms["buffers"] = world.split([list(layout.buffers)]) if layout.buffers else None
    return CoreContext(world, layout, comms)


def _context_fields(core: CoreContext, engine: str | None = None) -> dict[str, Any]:
    """torchgfn's context fields for this rank, from a gflowdist context.

    The groups are the native handles of ``engine`` (default: the core's);
    ``"local"`` gives None for every group (torchgfn's single-process mode).
    """
    layout, rank, engine = core.layout, core.rank, engine or core.world.engine
    role = layout.role_of(rank)
    groups = layout.agent_groups
    if role is Role.TRAINER:
        group_id = layout.group_of[rank]
    elif role is Role.BUFFER:  # torchgfn: the group of the first trainer it serves
        group_id = layout.group_of[layout.clients_of[rank][0]]
    else:  # torchgfn: 0 for the coordinator
        group_id = 0
    mine = core.comm("DP") if role is Role.TRAINER else None
    return dict(
        my_rank=rank,
        world_size=core.size,
        num_training_ranks=len(layout.trainers),
        agent_group_size=len(layout.trainers) // len(groups),
        agent_groups=[native_handle(mine if index == group_id else None, engine) for index in range(len(groups))],
        agent_group_id=group_id,
        train_global_group=native_handle(core.comm("trainers"), engine),
        assigned_buffer=layout.buffer_of.get(rank),
        buffer_group=native_handle(core.comm("buffers"), engine) if layout.buffers else None,
        assigned_training_ranks=list(layout.clients_of[rank]) if role is Role.BUFFER else None,
        buffer_rank_set=set(layout.buffers),
        coordinator_rank=layout.coordinator,
        core=core,
    )


# -- contexts -------------------------------------------------------------------------------


@dataclass
class _RankFacts:
    """The fields both torchgfn contexts start with, in torchgfn's order, and the role questions."""

    my_rank: int
    world_size: int
    num_training_ranks: int
    agent_group_size: int
    agent_groups: list[Any] | None = None
    agent_group_id: int | None = None
    train_global_group: Any | None = None
    assigned_buffer: int | None = None
    buffer_group: Any | None = None
    assigned_training_ranks: list[int] | None = None
    if TYPE_CHECKING:  # fields of the subclasses, each at its place in torchgfn's order
        buffer_rank_set: set[int] | None = None
        coordinator_rank: int | None = None

    def __post_init__(self) -> None:
        if self.buffer_rank_set is None:
            # Built by hand without it (torchgfn 2.4.1's own scripts do): 2.4.1's rule,
            # every rank past the trainers (other than the coordinator) is a buffer.
            self.buffer_rank_set = {
                r for r in range(self.num_training_ranks, self.world_size) if r != self.coordinator_rank
            }

    def is_buffer_rank(self) -> bool:
        """True for a replay-buffer rank (never the coordinator)."""
        return not self.is_coordinator_rank() and self.my_rank in self._buffer_ranks

    def is_training_rank(self) -> bool:
        """True for a trainer: neither a buffer nor the coordinator."""
        return not self.is_coordinator_rank() and self.my_rank not in self._buffer_ranks

    @property
    def _buffer_ranks(self) -> set[int]:
        ranks = self.buffer_rank_set
        if ranks is None:  # __post_init__ sets it; only a later assignment of None gets here
            raise GflowdistError("buffer_rank_set is None: set it to the buffer ranks (a set of ints)")
        return ranks

    def is_coordinator_rank(self) -> bool:
        """True for the coordinator (rank ``world_size - 1`` when there is one)."""
        return self.coordinator_rank is not None and self.my_rank == self.coordinator_rank


@dataclass
class DistributedContextMPI4Py(_RankFacts):
    """torchgfn's ``DistributedContextMPI4Py``: this rank's role, peers and groups.

    Same fields as torchgfn, in its order; the groups are mpi4py
    communicators (``MPI.COMM_NULL`` where this rank is not a member; see
    the module docstring). ``core`` is the
    :class:`gflowdist.context.DistributedContext` that owns them (None for a
    context built by hand). ``buffer_rank_set`` left out (None) means
    torchgfn 2.4.1's rule: the ranks from ``num_training_ranks`` on.
    """

    buffer_rank_set: set[int] | None = None
    coordinator_rank: int | None = None
    core: CoreContext | None = field(default=None, repr=False, compare=False)

    def cleanup(self) -> None:
        """Free this context's sub-communicators. Never raises; calling it again does nothing."""
        if self.core is not None:
            self.core.cleanup()


@dataclass
class DistributedContext(_RankFacts):
    """torchgfn's ``DistributedContext``: this rank's role, peers and groups.

    Same fields as torchgfn, in its order. ``train_global_group``,
    ``agent_groups`` and ``buffer_group`` are ``torch.distributed`` process
    groups (``GroupMember.NON_GROUP_MEMBER`` where this rank is not a
    member); ``dc_mpi4py`` holds the MPI ones when an MPI launcher started
    the job. ``core`` is the :class:`gflowdist.context.DistributedContext`
    that owns the torch groups. ``buffer_rank_set`` left out (None) means
    torchgfn 2.4.1's rule: the ranks from ``num_training_ranks`` on.
    """

    dc_mpi4py: DistributedContextMPI4Py | None = None
    coordinator_rank: int | None = None
    buffer_rank_set: set[int] | None = None
    training_ranks: list[int] = field(default_factory=list)
    core: CoreContext | None = field(default=None, repr=False, compare=False)

    def cleanup(self) -> None:
        """Free the sub-communicators, and the process group if initialize_distributed_compute made it.

        Never raises; calling it again does nothing. MPI itself is not
        finalized (mpi4py does that at exit; torchgfn's ``MPI.Finalize()`` here
        made any later MPI call fail).
        """
        if self.core is not None:
            self.core.cleanup()
        if self.dc_mpi4py is not None:
            self.dc_mpi4py.cleanup()
        release_process_group()

    def get_train_group(self, backend: str = "mpi") -> Any:
        """The trainers' group of ``backend``: ``"mpi"`` -> ``dc_mpi4py``'s, ``"torch"`` -> this context's."""
        if engine_of(backend) == TORCH.name:
            return self.train_global_group
        if self.dc_mpi4py is not None:
            return self.dc_mpi4py.train_global_group
        if self.world_size == 1:
            return self.train_global_group  # a world of one has one group for both names
        raise GflowdistError(
            "get_train_group('mpi'): this job has no MPI groups (no MPI launcher "
            "started it); use get_train_group('torch')"
        )


#: torchgfn 2.4.1's name of the MPI context class.
DistributedContextmpi4py = DistributedContextMPI4Py


# -- entry points ---------------------------------------------------------------------------


def initialize_distributed_compute_mpi4py(
    num_remote_buffers: int,
    num_agent_groups: int = 1,
    num_coordinators: int = 0,
    layout: Any = None,
) -> DistributedContextMPI4Py:
    """torchgfn's MPI context over the MPI world; needs nothing else (no torch.distributed).

    Collective over the MPI world: gathers host names, plans the layout
    (module docstring), checks every rank planned the same, then splits the
    groups. ``layout``, when given, is used as it is, as torchgfn does (no
    host names gathered, no planning): a torchgfn ``RankLayout`` (gflowdist's
    :class:`~gflowdist.compat.torchgfn.RankLayout` or torchgfn's own) or a
    :class:`gflowdist.layout.Layout`. Unlike torchgfn, it must hold what the
    arguments ask for (buffers, agent groups, coordinator) and be the same on
    every rank, else :class:`LayoutError`.
    In a plain process this is a world of one (torchgfn's single-process mode).
    A torch.distributed job that no MPI launcher started raises.
    """
    torchgfn_layout_config(num_remote_buffers, num_agent_groups, num_coordinators)  # validates
    world = world_for(MPI.name)
    if layout is None or world.size == 1:
        core = _create_core(world, num_remote_buffers, num_agent_groups, num_coordinators)
    else:
        given = as_layout(layout, world.size)
        _check_arguments(given, num_remote_buffers, num_agent_groups, num_coordinators)
        core = _core_from_layout(world, given)
    return DistributedContextMPI4Py(**_context_fields(core))


def initialize_distributed_compute(
    dist_backend: str,
    num_remote_buffers: int,
    num_agent_groups: int = 1,
    use_coordinator: bool = False,
) -> DistributedContext:
    """torchgfn's context over torch.distributed (``dist_backend`` gloo, ccl or mpi).

    Uses the process group when one exists; otherwise, when a launcher
    announced more than one rank, initializes one (``env://`` when
    ``MASTER_ADDR``/``MASTER_PORT`` are set, else an address the ranks agree
    on through MPI) and :meth:`DistributedContext.cleanup` destroys it again.
    When an MPI launcher started the job, ``dc_mpi4py`` holds the same layout's
    MPI groups. One announced rank: torchgfn's single-process mode.
    """
    torchgfn_layout_config(num_remote_buffers, num_agent_groups, 1 if use_coordinator else 0)
    check_dist_backend(dist_backend)
    coordinators = 1 if use_coordinator else 0
    if not torch_initialized():
        size = launcher_world_size()
        if size <= 1:
            core = _create_core(world_comm(), num_remote_buffers, num_agent_groups, coordinators)
            return DistributedContext(training_ranks=[0], **_context_fields(core, LOCAL.name))
        init_process_group(dist_backend, size)
    world = world_for(TORCH.name)
    core = _create_core(world, num_remote_buffers, num_agent_groups, coordinators)
    dc = None
    if world.size > 1 and in_mpi_job():
        dc = initialize_distributed_compute_mpi4py(
            num_remote_buffers, num_agent_groups, coordinators, layout=core.layout
        )
    return DistributedContext(dc_mpi4py=dc, training_ranks=list(core.layout.trainers), **_context_fields(core))
