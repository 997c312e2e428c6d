"""torchgfn's distributed contexts, built on :class:`gflowdist.context.DistributedContext`.

Private helper of :mod:`gflowdist.compat.torchgfn` (import from there). It holds

- which world communicator a torchgfn ``backend`` name means (:func:`world_for`,
  :func:`resolve_group`);
- the two context dataclasses, :class:`DistributedContext` and
  :class:`DistributedContextMPI4Py`, with torchgfn's field names;
- the two entry points that build them, :func:`initialize_distributed_compute`
  and :func:`initialize_distributed_compute_mpi4py`.

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

Where torchgfn hands out ``torch.distributed`` process groups or mpi4py
communicators, these contexts hand out gflowdist
:class:`~gflowdist.comm.Communicator` objects (pass them to the functions of
:mod:`gflowdist.compat.torchgfn`, or use their own methods). A rank that is
not a member of a group gets a :class:`NonMemberGroup` in that attribute:
``get_rank`` / ``get_world_size`` report -1 for it (as torch.distributed does
for a non-member) and every collective on it raises, instead of silently
running over some other group.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

from gflowdist.comm import Communicator, in_mpi_job, in_torch_job, launcher_world_size, world_comm
from gflowdist.comm.select import reset_world_comm
from gflowdist.context import DistributedContext as CoreContext
from gflowdist.errors import ConfigError, GflowdistError, LayoutError
from gflowdist.layout import Layout, Role

__all__ = [
    "BACKENDS",
    "NonMemberGroup",
    "DistributedContext",
    "DistributedContextMPI4Py",
    "initialize_distributed_compute",
    "initialize_distributed_compute_mpi4py",
    "torchgfn_layout_config",
    "world_for",
    "resolve_group",
]

logger = logging.getLogger(__name__)

#: torchgfn's ``backend`` names and the gflowdist engine each one means.
BACKENDS = {"mpi": "mpi", "torch": "torch"}
#: torch.distributed backends ``initialize_distributed_compute`` accepts (torchgfn's list).
DIST_BACKENDS = ("ccl", "mpi", "gloo")

#: World communicator per engine, once resolved (the same object for every call).
_WORLDS: dict[str, Communicator] = {}
#: True while a process group that initialize_distributed_compute created is alive.
_OWNS_PROCESS_GROUP = False


# -- backends and groups --------------------------------------------------------------------


def engine_of(backend: str) -> str:
    """The gflowdist engine of a torchgfn ``backend`` name (``"mpi"`` or ``"torch"``)."""
    engine = BACKENDS.get(backend) if isinstance(backend, str) else None
    if engine is None:
        raise ConfigError(f"unknown backend {backend!r}; expected 'mpi' or 'torch'", key="backend")
    return engine


def _torch_initialized() -> bool:
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def world_for(engine: str) -> Communicator:
    """The world communicator that torchgfn's backend name ``engine`` means in this job.

    - The job's world (:func:`gflowdist.comm.world_comm`) when it runs on that engine.
    - In a plain process (a world of one) the one local communicator, for both names.
    - ``"mpi"`` in a job started by an MPI launcher whose world is torch.distributed
      (torchgfn's mpiexec + gloo setup): an MPI communicator over ``COMM_WORLD``.
    - ``"torch"`` in an MPI job once a torch.distributed process group exists.

    Anything else raises :class:`GflowdistError` saying which backend the job has.
    The answer is remembered, so every call with one name uses the same
    communicator (and its point-to-point channel).
    """
    known = _WORLDS.get(engine)
    if known is not None:
        return known
    current = world_comm()
    if current.engine == "local" and not (engine == "torch" and _torch_initialized()):
        return current  # not remembered: the job may set up an engine later
    if current.engine == engine:
        comm = current
    elif engine == "mpi":
        if not in_mpi_job():
            raise GflowdistError(
                f"backend 'mpi' was requested, but this is a {current.engine} job of {current.size} "
                "ranks that no MPI launcher started; pass backend='torch' (or start the job with mpiexec)")
        from mpi4py import MPI

        from gflowdist.comm.mpi import MPIComm

        comm = MPIComm(MPI.COMM_WORLD)
    else:
        if not (_torch_initialized() or in_torch_job()):
            raise GflowdistError(
                f"backend 'torch' was requested, but this {current.engine} job of {current.size} ranks "
                "has no torch.distributed process group; call initialize_distributed_compute(...) "
                "first, or pass backend='mpi'")
        if current.engine == "mpi":
            _WORLDS.setdefault("mpi", current)
        comm = world_comm("torch")
    _WORLDS[engine] = comm
    return comm


class NonMemberGroup:
    """Stands in for a group this rank is not a member of (torch's non-member handle, MPI's COMM_NULL).

    ``name`` is the context attribute (``"train_global_group"``) and
    ``members`` the world ranks of the group.
    """

    def __init__(self, name: str, members: Sequence[int], rank: int):
        self.name = name
        self.members = tuple(members)
        self.rank = rank

    def error(self, what: str) -> GflowdistError:
        members = ", ".join(map(str, self.members)) or "none"
        return GflowdistError(f"{what}: rank {self.rank} is not a member of {self.name} "
                              f"(world ranks {members}); only its members may use it")

    def __repr__(self) -> str:
        return f"<NonMemberGroup {self.name} (rank {self.rank} is not one of {list(self.members)})>"


def resolve_group(backend: str, group: Any, what: str) -> Communicator:
    """The communicator a torchgfn call means by ``(backend, group)``.

    ``group=None`` is the world of ``backend`` (:func:`world_for`). A gflowdist
    :class:`Communicator` (what this module's contexts hold) is used as it is:
    it knows its engine, so ``backend`` is only checked for a valid name.
    ``torch.distributed.group.WORLD`` and ``MPI.COMM_WORLD`` mean the world of
    their engine. A :class:`NonMemberGroup` raises, naming ``what`` was tried.
    """
    engine = engine_of(backend)
    if group is None:
        return world_for(engine)
    if isinstance(group, Communicator):
        return group
    if isinstance(group, NonMemberGroup):
        raise group.error(what)
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and group is dist.group.WORLD:
            return world_for("torch")
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(group, mpi.Comm) and group == mpi.COMM_WORLD:
        return world_for("mpi")
    raise TypeError(
        f"{what}: group must be None, a gflowdist Communicator (the groups of this module's "
        f"DistributedContext), torch.distributed.group.WORLD or MPI.COMM_WORLD; got "
        f"{type(group).__module__}.{type(group).__qualname__}")


# -- layout ---------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or \
            (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"must be an integer {bound}, got {value!r}", key=name)
    return value


def torchgfn_layout_config(num_remote_buffers: int, num_agent_groups: int = 1,
                           num_coordinators: int = 0) -> dict[str, Any]:
    """The gflowdist layout config that reproduces torchgfn's rank assignment.

    Node-local placement when there are buffers (plan it with
    ``fallback_to_block=True``: torchgfn falls back to the arithmetic rule when
    the hosts do not allow it), block placement otherwise.
    """
    buffers = _check_int("num_remote_buffers", num_remote_buffers, 0)
    groups = _check_int("num_agent_groups", num_agent_groups, 1)
    coordinators = _check_int("num_coordinators", num_coordinators, 0, 1)
    return {"trainers": "rest", "actors": 0, "buffers": buffers, "coordinator": bool(coordinators),
            "agent_groups": groups, "placement": "node-local" if buffers else "block"}


_SINGLE_PROCESS = {"trainers": 1, "actors": 0, "buffers": 0, "coordinator": False, "agent_groups": 1,
                   "placement": "block"}


def _create_core(world: Communicator, num_remote_buffers: int, num_agent_groups: int,
                 num_coordinators: int) -> CoreContext:
    cfg = torchgfn_layout_config(num_remote_buffers, num_agent_groups, num_coordinators)
    if world.size == 1:
        # torchgfn's single-process mode: one trainer, whatever was asked for.
        logger.info("world of one rank: single-process mode (buffers, coordinator and agent "
                    "groups are ignored)")
        cfg = _SINGLE_PROCESS
    core = CoreContext.create(cfg, comm=world, fallback_to_block=True)
    if world.rank == 0:
        logger.info("rank layout:\n%s", core.layout.describe())
    return core


def _layout_facts(layout: Layout) -> dict[str, Any]:
    """What torchgfn's contexts expose of a layout (host names and notes left out)."""
    facts = layout.to_dict()
    for key in ("hosts", "note", "placement"):
        facts.pop(key)
    return facts


def _context_fields(core: CoreContext) -> dict[str, Any]:
    """torchgfn's context fields for this rank, from a gflowdist context."""
    layout, rank = core.layout, core.rank
    role = layout.role_of(rank)
    groups = layout.agent_groups
    if role is Role.TRAINER:
        group_id = layout.group_of[rank]
    elif role is Role.BUFFER:  # torchgfn: the group of the first trainer it serves
        group_id = layout.group_of[layout.clients_of[rank][0]]
    else:  # torchgfn: 0 for the coordinator
        group_id = 0
    dp = core.comm("DP")
    agent_groups: list[Any] = [
        dp if role is Role.TRAINER and index == group_id else
        NonMemberGroup(f"agent_groups[{index}]", members, rank)
        for index, members in enumerate(groups)]
    trainers = core.comm("trainers")
    buffers = core.comm("buffers")
    return dict(
        my_rank=rank,
        world_size=core.size,
        num_training_ranks=len(layout.trainers),
        agent_group_size=len(layout.trainers) // len(groups),
        agent_groups=agent_groups,
        agent_group_id=group_id,
        train_global_group=trainers if trainers is not None else
        NonMemberGroup("train_global_group", layout.trainers, rank),
        assigned_buffer=layout.buffer_of.get(rank),
        buffer_group=None if not layout.buffers else buffers if buffers is not None else
        NonMemberGroup("buffer_group", layout.buffers, rank),
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
    agent_groups: Optional[list[Any]] = None
    agent_group_id: Optional[int] = None
    train_global_group: Optional[Any] = None
    assigned_buffer: Optional[int] = None
    buffer_group: Optional[Any] = None
    assigned_training_ranks: Optional[list[int]] = None
    if TYPE_CHECKING:  # fields of the subclasses, each at its place in torchgfn's order
        buffer_rank_set: set[int]
        coordinator_rank: Optional[int]

    def is_buffer_rank(self) -> bool:
        """True for a replay-buffer rank (never the coordinator)."""
        return not self.is_coordinator_rank() and self.my_rank in self.buffer_rank_set

    def is_training_rank(self) -> bool:
        """True for a trainer: neither a buffer nor the coordinator."""
        return not self.is_coordinator_rank() and self.my_rank not in self.buffer_rank_set

    def is_coordinator_rank(self) -> bool:
        """True for the coordinator (rank ``world_size - 1`` when there is one)."""
        return self.coordinator_rank is not None and self.my_rank == self.coordinator_rank


@dataclass
class DistributedContextMPI4Py(_RankFacts):
    """torchgfn's ``DistributedContextMPI4Py``: this rank's role, peers and groups.

    Same fields as torchgfn, in its order; the groups are gflowdist
    communicators (see the module docstring). ``core`` is the
    :class:`gflowdist.context.DistributedContext` that owns them (None for a
    context built by hand).
    """

    buffer_rank_set: set[int] = field(default_factory=set)
    coordinator_rank: Optional[int] = None
    core: Optional[CoreContext] = field(default=None, repr=False, compare=False)

    def cleanup(self) -> None:
        """Free this context's sub-communicators. Never raises; calling it again does nothing."""
        if self.core is not None:
            self.core.cleanup()


@dataclass
class DistributedContext(_RankFacts):
    """torchgfn's ``DistributedContext``: this rank's role, peers and groups.

    Same fields as torchgfn, in its order. ``train_global_group``,
    ``agent_groups`` and ``buffer_group`` are the groups of
    ``backend="torch"``; ``dc_mpi4py`` holds the MPI ones when an MPI launcher
    started the job. ``core`` is the :class:`gflowdist.context.DistributedContext`
    that owns the torch groups.
    """

    dc_mpi4py: Optional[DistributedContextMPI4Py] = None
    coordinator_rank: Optional[int] = None
    buffer_rank_set: set[int] = field(default_factory=set)
    training_ranks: list[int] = field(default_factory=list)
    core: Optional[CoreContext] = field(default=None, repr=False, compare=False)

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
        _release_process_group()

    def get_train_group(self, backend: str = "mpi") -> Any:
        """The trainers' group of ``backend``: ``"mpi"`` -> ``dc_mpi4py``'s, ``"torch"`` -> this context's."""
        if engine_of(backend) == "torch":
            return self.train_global_group
        if self.dc_mpi4py is not None:
            return self.dc_mpi4py.train_global_group
        if self.world_size == 1:
            return self.train_global_group  # a world of one has one group for both names
        raise GflowdistError("get_train_group('mpi'): this job has no MPI groups (no MPI launcher "
                             "started it); use get_train_group('torch')")


# -- entry points ---------------------------------------------------------------------------


def initialize_distributed_compute_mpi4py(
    num_remote_buffers: int,
    num_agent_groups: int = 1,
    num_coordinators: int = 0,
    layout: Optional[Layout] = None,
) -> DistributedContextMPI4Py:
    """torchgfn's MPI context over the MPI world; needs nothing else (no torch.distributed).

    Collective over the MPI world: gathers host names, plans the layout
    (module docstring), checks every rank planned the same, then splits the
    groups. ``layout``, when given (a :class:`gflowdist.layout.Layout`), must be
    the layout this job plans; a different one raises :class:`LayoutError`.
    In a plain process this is a world of one (torchgfn's single-process mode).
    A torch.distributed job that no MPI launcher started raises.
    """
    torchgfn_layout_config(num_remote_buffers, num_agent_groups, num_coordinators)  # validates
    world = world_for("mpi")
    core = _create_core(world, num_remote_buffers, num_agent_groups, num_coordinators)
    if layout is not None and world.size > 1 and _layout_facts(layout) != _layout_facts(core.layout):
        core.cleanup()
        raise LayoutError("initialize_distributed_compute_mpi4py: the layout passed in differs from "
                          f"the one this job plans ({core.layout.summary()})")
    return DistributedContextMPI4Py(**_context_fields(core))


def _first_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def _check_dist_backend(dist_backend: str) -> None:
    import torch.distributed as dist

    if dist_backend not in DIST_BACKENDS:
        raise ConfigError(f"invalid backend {dist_backend!r}; expected one of {', '.join(DIST_BACKENDS)}",
                          key="dist_backend")
    if dist_backend == "mpi" and not dist.is_mpi_available():
        raise GflowdistError("dist_backend='mpi': this torch was built without MPI support; use "
                             "dist_backend='gloo' (or initialize_distributed_compute_mpi4py for MPI groups)")
    if dist_backend == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401
        except ImportError as exc:
            raise GflowdistError(f"dist_backend='ccl' needs oneccl_bindings_for_pytorch: {exc}") from exc
    if dist_backend == "gloo" and not dist.is_gloo_available():
        raise GflowdistError("dist_backend='gloo': this torch was built without gloo")


def _rendezvous_over_mpi() -> str:
    """``tcp://address:port`` agreed through MPI: an address of rank 0's host and a port free there.

    One host: ``127.0.0.1``. Several: the first address rank 0's host name
    resolves to that is not a loopback one (the store listens on that address
    only, so ``127.0.1.1`` from ``/etc/hosts`` would be unreachable from the
    other hosts); when there is none, every rank raises :class:`ConfigError`.
    """
    mpi_world = world_for("mpi")
    hosts = [h.decode() for h in mpi_world.all_gather_bytes(mpi_world.host.encode())]
    mine = b""
    if mpi_world.rank == 0:
        try:
            address = "127.0.0.1" if len(set(hosts)) == 1 else _reachable_address(socket.gethostname())
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
                port = probe.getsockname()[1]
            mine = f"tcp://{f'[{address}]' if ':' in address else address}:{port}".encode()
        except (OSError, ConfigError) as exc:
            mine = f"error:{exc}".encode()
    agreed = mpi_world.all_gather_bytes(mine)[0].decode()
    if agreed.startswith("error:"):
        raise ConfigError(f"the ranks could not agree on a rendezvous address through MPI: "
                          f"{agreed[len('error:'):]}; set MASTER_ADDR and MASTER_PORT", key="MASTER_ADDR")
    return agreed


def _reachable_address(hostname: str) -> str:
    """The first address ``hostname`` resolves to that is not a loopback address."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"rank 0's host name {hostname!r} does not resolve: {exc.strerror}") from exc
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    for address in addresses:
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            return address
    raise ConfigError(f"rank 0's host name {hostname!r} resolves only to loopback addresses "
                      f"({', '.join(addresses)}), which the other hosts cannot reach")


def _init_process_group(dist_backend: str, world_size: int) -> None:
    """torchgfn's process-group set-up: rank and size from the launcher's variables."""
    global _OWNS_PROCESS_GROUP
    from datetime import timedelta

    from gflowdist.comm.rendezvous import init_default_group

    rank = _first_env("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "RANK")
    if rank is None or not rank.isdigit():
        raise GflowdistError(f"initialize_distributed_compute: the launcher announced {world_size} ranks "
                             f"but no rank variable (PMI_RANK, OMPI_COMM_WORLD_RANK, RANK) was found")
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        init_method = "env://"
    elif in_mpi_job():
        init_method = _rendezvous_over_mpi()  # torchgfn needs MASTER_ADDR/MASTER_PORT set by hand
    else:
        raise GflowdistError("initialize_distributed_compute: set MASTER_ADDR and MASTER_PORT, or start "
                             "the job with mpiexec (ranks then agree on an address through MPI)")
    logger.info("initializing torch.distributed (%s) as rank %s of %d via %s", dist_backend, rank,
                world_size, init_method)
    init_default_group(dist_backend, init_method=init_method, world_size=world_size, rank=int(rank),
                       timeout=timedelta(minutes=5))
    _OWNS_PROCESS_GROUP = True


def _release_process_group() -> None:
    """Destroy the process group initialize_distributed_compute created (idempotent)."""
    global _OWNS_PROCESS_GROUP
    if not _OWNS_PROCESS_GROUP:
        return
    _OWNS_PROCESS_GROUP = False
    torch_world = _WORLDS.pop("torch", None)
    if torch_world is not None:
        torch_world.free()
    if _torch_initialized():
        import torch.distributed as dist

        dist.destroy_process_group()
    reset_world_comm()


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
    _check_dist_backend(dist_backend)
    coordinators = 1 if use_coordinator else 0
    if not _torch_initialized():
        size = launcher_world_size()
        if size <= 1:
            core = _create_core(world_comm(), num_remote_buffers, num_agent_groups, coordinators)
            return DistributedContext(training_ranks=[0], **_context_fields(core))
        _init_process_group(dist_backend, size)
    world = world_for("torch")
    core = _create_core(world, num_remote_buffers, num_agent_groups, coordinators)
    dc = None
    if world.size > 1 and in_mpi_job():
        dc = initialize_distributed_compute_mpi4py(num_remote_buffers, num_agent_groups, coordinators,
                                                   layout=core.layout)
    return DistributedContext(dc_mpi4py=dc, training_ranks=list(core.layout.trainers),
                              **_context_fields(core))
