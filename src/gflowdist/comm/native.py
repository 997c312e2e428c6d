"""The groups users already hold — torch.distributed process groups, mpi4py communicators — as communicators.

Code that comes from torch.distributed or mpi4py passes its own group
objects: ``dist.new_group(...)``, ``dist.group.WORLD``,
``MPI.COMM_WORLD.Split(...)`` or ``Create(...)``. :func:`as_communicator`
turns any of them (or a gflowdist :class:`Communicator`, returned as it is)
into the gflowdist communicator over that group:

- every :class:`~gflowdist.comm.mpi.MPIComm` and
  :class:`~gflowdist.comm.torch_dist.TorchComm` is entered in its session's
  :class:`~gflowdist.comm.registry.NativeGroups` when it is made
  (:func:`register`, :mod:`gflowdist.comm.session`), so a group gflowdist created — a context's
  sub-group, the job's world — maps back to the communicator that owns it,
  with its helper threads, buffer pools and fast paths;
- a group made elsewhere is wrapped once, on first use, by its engine's
  descriptor (:meth:`gflowdist.engines.Engine.wrap_native`), and the wrapper is
  kept (the same communicator object every time) until it is freed or the
  session closes.

Wrapping an mpi4py communicator duplicates it for point-to-point traffic
(``MPI_Comm_dup``), which is collective over that communicator: the first
use must be a collective that every member makes, as every gflowdist
function taking a ``group`` is. Asking a group's rank or size
(:func:`rank_and_size`) never wraps it, so it needs no other rank.

Ranks that are not members of a group hold what the libraries give them:
``torch.distributed.GroupMember.NON_GROUP_MEMBER`` or ``MPI.COMM_NULL``.
:func:`rank_and_size` answers ``(-1, -1)`` for them (as
``torch.distributed.get_rank(group)`` does); :func:`as_communicator` raises
:class:`NotAMemberError`, since a collective there would otherwise run over
some other group or do nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from gflowdist.comm.base import Communicator
from gflowdist.comm.registry import native_key
from gflowdist.comm.session import current_session, register, unregister
from gflowdist.engines import MPI, engine_named
from gflowdist.errors import GflowdistError

__all__ = [
    "Group",
    "NotAMemberError",
    "as_communicator",
    "is_native_group",
    "is_non_member",
    "rank_and_size",
    "register",
    "unregister",
]


#: What a ``group`` argument may be: a gflowdist :class:`Communicator`, a torch.distributed
#: ``ProcessGroup`` or an mpi4py ``Comm`` (or a non-member's handle of either).
Group = Any


class NotAMemberError(GflowdistError):
    """A collective was asked of a group this rank is not a member of."""


def _torch_dist() -> Any:
    """``torch.distributed`` when it is imported and initialised, else None (importing nothing)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def _mpi() -> Any:
    """``mpi4py.MPI`` when the program imported it, else None (never initialises MPI)."""
    return sys.modules.get("mpi4py.MPI")


def is_non_member(group: Any) -> bool:
    """True for what a rank outside a group holds: ``NON_GROUP_MEMBER`` or ``MPI.COMM_NULL``."""
    dist = sys.modules.get("torch.distributed")
    if (
        dist is not None
        and dist.is_available()
        and isinstance(group, int)
        and not isinstance(group, bool)
        and group == dist.GroupMember.NON_GROUP_MEMBER
    ):
        return True
    mpi = _mpi()
    return mpi is not None and isinstance(group, mpi.Comm) and group == mpi.COMM_NULL


def is_native_group(group: Any) -> bool:
    """True for a torch process group, an mpi4py communicator, or a non-member's handle of either."""
    return native_key(group) is not None or is_non_member(group)


def rank_and_size(group: Any) -> tuple[int, int]:
    """This rank's rank in ``group`` and the group's size; ``(-1, -1)`` for a non-member. No communication."""
    if isinstance(group, Communicator):
        return group.rank, group.size
    if is_non_member(group):
        return -1, -1
    key = native_key(group)
    if key is None:
        raise _not_a_group(group, "rank_and_size")
    if key[0] == MPI.name:
        return group.Get_rank(), group.Get_size()
    dist = _torch_dist()
    if dist is None:
        raise GflowdistError("a torch.distributed process group was passed, but no process group is initialised")
    return dist.get_rank(group), dist.get_world_size(group)


def as_communicator(group: Any, what: str = "this call") -> Communicator:
    """The gflowdist communicator over ``group`` (see the module docstring); ``what`` names the caller in errors."""
    if isinstance(group, Communicator):
        return group
    if is_non_member(group):
        raise NotAMemberError(
            f"{what}: this rank is not a member of the group it was given "
            f"({_describe(group)}); only the group's members may use it"
        )
    key = native_key(group)
    if key is None:
        raise _not_a_group(group, what)
    groups = current_session().groups
    found = groups.known(group, key)
    if found is not None:
        return found
    comm = engine_named(key[0]).wrap_native(group)  # gflowdist.comm.worlds
    groups.register(comm, group)
    return comm


def _describe(group: Any) -> str:
    mpi = _mpi()
    if mpi is not None and isinstance(group, mpi.Comm):
        return "MPI.COMM_NULL"
    return "torch.distributed.GroupMember.NON_GROUP_MEMBER"


def _not_a_group(group: Any, what: str) -> TypeError:
    return TypeError(
        f"{what}: group must be None, a gflowdist Communicator, a torch.distributed ProcessGroup "
        f"or an mpi4py communicator; got {type(group).__module__}.{type(group).__qualname__}"
    )
