"""Which group a torchgfn call means, and what torchgfn's contexts hold for each group.

Private helper of :mod:`gflowdist.compat.torchgfn` (import from there):

- :func:`world_for`: the world communicator a torchgfn ``backend`` name
  (``"mpi"``, ``"torch"``) means in this job;
- :func:`resolve_group`: the communicator of a ``(backend, group)`` pair,
  where ``group`` is None (that backend's world), a gflowdist
  :class:`~gflowdist.comm.Communicator`, or a native group — a
  torch.distributed process group or an mpi4py communicator, the contexts'
  or the user's own (:mod:`gflowdist.comm.native`: wrapped once, cached);
- :func:`native_handle`: what torchgfn hands out for a group — the
  ``ProcessGroup`` / mpi4py ``Comm`` itself, or on a rank outside the group
  ``GroupMember.NON_GROUP_MEMBER`` / ``MPI.COMM_NULL``.
"""

from __future__ import annotations

import sys
from typing import Any, cast

from gflowdist.comm import Communicator, in_mpi_job, in_torch_job
from gflowdist.comm.native import as_communicator
from gflowdist.comm.session import current_session
from gflowdist.engines import LOCAL, MPI, TORCH
from gflowdist.errors import ConfigError, GflowdistError

__all__ = [
    "BACKENDS",
    "engine_of",
    "known_world",
    "world_for",
    "forget_world",
    "resolve_group",
    "native_handle",
    "torch_initialized",
]

#: torchgfn's ``backend`` names and the gflowdist engine each one means.
BACKENDS = {"mpi": MPI.name, "torch": TORCH.name}


def engine_of(backend: str) -> str:
    """The gflowdist engine of a torchgfn ``backend`` name (``"mpi"`` or ``"torch"``)."""
    engine = BACKENDS.get(backend) if isinstance(backend, str) else None
    if engine is None:
        raise ConfigError(f"unknown backend {backend!r}; expected 'mpi' or 'torch'", key="backend")
    return engine


def torch_initialized() -> bool:
    """True when torch.distributed is imported and has a default process group."""
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
    The answer is the session's (:mod:`gflowdist.comm.session`), one cache with
    :func:`gflowdist.comm.world_comm`'s, so every call with one name uses the
    same communicator (and its point-to-point channel).
    """
    session = current_session()
    known = session.world_of(engine)
    if known is not None:
        return known
    current = session.world()
    if current.engine == LOCAL.name and not (engine == TORCH.name and torch_initialized()):
        return current  # the world of one, for both names: the job may set up an engine later
    if current.engine == engine:
        return current
    if engine == MPI.name:
        if not in_mpi_job():
            raise GflowdistError(
                f"backend 'mpi' was requested, but this is a {current.engine} job of {current.size} "
                "ranks that no MPI launcher started; pass backend='torch' (or start the job with mpiexec)"
            )
        return session.world_beside(MPI.name)
    if not (torch_initialized() or in_torch_job()):
        raise GflowdistError(
            f"backend 'torch' was requested, but this {current.engine} job of {current.size} ranks "
            "has no torch.distributed process group; call initialize_distributed_compute(...) "
            "first, or pass backend='mpi'"
        )
    return session.world(TORCH.name)  # the job's world from now on (as auto would pick it)


def known_world(backend: str) -> Communicator | None:
    """The world a torchgfn ``backend`` name resolved to before (the names are the engines' names), else None."""
    return current_session().world_of(backend)


def forget_world(engine: str) -> Communicator | None:
    """Forget (and return) the remembered world of ``engine`` (its process group is going away)."""
    return current_session().forget_world(engine)


def _is_world_object(group: Any) -> str | None:
    """``"torch"`` for ``dist.group.WORLD``, ``"mpi"`` for ``MPI.COMM_WORLD``, else None."""
    if torch_initialized() and group is sys.modules["torch.distributed"].group.WORLD:
        return TORCH.name
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(group, mpi.Comm) and group == mpi.COMM_WORLD:
        return MPI.name
    return None


def resolve_group(backend: str, group: Any, what: str) -> Communicator:
    """The communicator a torchgfn call means by ``(backend, group)``.

    ``group=None`` is the world of ``backend`` (:func:`world_for`). Any other
    group decides the engine itself (``backend`` is only checked for a valid
    name): a gflowdist :class:`Communicator` is used as it is;
    ``dist.group.WORLD`` and ``MPI.COMM_WORLD`` mean the world of their
    engine; any other process group or mpi4py communicator goes through
    :func:`gflowdist.comm.native.as_communicator`. A non-member's handle
    raises :class:`~gflowdist.comm.native.NotAMemberError` naming ``what``.
    """
    engine = engine_of(backend)
    if group is None:
        return world_for(engine)
    world = _is_world_object(group)
    if world is not None:
        return world_for(world)
    return as_communicator(group, what)


def native_handle(comm: Communicator | None, engine: str) -> Any:
    """What torchgfn holds for a group: its process group / mpi4py communicator, or the non-member handle.

    ``comm`` None means this rank is not a member: torch's
    ``GroupMember.NON_GROUP_MEMBER`` or ``MPI.COMM_NULL``, as torchgfn's
    ``new_group`` / ``Create`` give. In a world of one (``engine ==
    "local"``) there is no native group: None, which every function here
    reads as the world of one.
    """
    if engine == MPI.name:
        from mpi4py import MPI as mpi4py

        from gflowdist.comm.mpi import MPIComm

        return mpi4py.COMM_NULL if comm is None else cast(MPIComm, comm).mpi_comm  # the mpi engine's communicator
    if engine == TORCH.name:
        import torch.distributed as dist

        if comm is None:
            return dist.GroupMember.NON_GROUP_MEMBER
        from gflowdist.comm.torch_dist import TorchComm

        group = cast(TorchComm, comm).process_group  # the torch engine's communicator
        return group if group is not None else dist.group.WORLD
    return None
