"""Which communicator owns which native group (a torch process group, an mpi4py communicator).

Every :class:`~gflowdist.comm.mpi.MPIComm` and
:class:`~gflowdist.comm.torch_dist.TorchComm` is entered here when it is made
(:func:`register`), so that :func:`gflowdist.comm.native.as_communicator`
maps a group gflowdist created back to the communicator that owns it. This
module imports no engine (the engines import it), so nothing here imports in
a circle.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from gflowdist.comm.base import Communicator
from gflowdist.engines import MPI, TORCH

__all__ = ["native_key", "register", "unregister", "known"]

#: (engine name, key) -> (the native group object, its communicator)
_KNOWN: dict[tuple[str, int], tuple[Any, Communicator]] = {}
_LOCK = threading.Lock()


def native_key(group: Any) -> tuple[str, int] | None:
    """The registry key of a native group (its engine's name first), or None when ``group`` is not one."""
    mpi = sys.modules.get("mpi4py.MPI")  # never imports (or initialises) MPI
    if mpi is not None and isinstance(group, mpi.Comm):
        return (MPI.name, group.handle)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(group, dist.ProcessGroup):
        return (TORCH.name, id(group))
    return None


def register(comm: Communicator, group: Any) -> None:
    """Remember that ``comm`` is the communicator over the native ``group`` (engines call this)."""
    key = native_key(group)
    if key is not None:
        with _LOCK:
            _KNOWN[key] = (group, comm)


def unregister(comm: Communicator) -> None:
    """Forget ``comm`` (freed): the registry holds no reference to its native group any more."""
    with _LOCK:
        for key in [key for key, (_, owner) in _KNOWN.items() if owner is comm]:
            del _KNOWN[key]


def known(group: Any, key: tuple[str, int]) -> Communicator | None:
    """The live communicator registered for ``group`` (whose key is ``key``), else None."""
    with _LOCK:
        entry = _KNOWN.get(key)
    if entry is None:
        return None
    native, comm = entry
    alive = not getattr(comm, "_freed", False)
    same = native is group if key[0] == TORCH.name else (native == group and native.handle == key[1])
    if alive and same:
        return comm
    with _LOCK:  # freed, or an old handle value the MPI library gave to a new communicator
        if _KNOWN.get(key) is entry:
            del _KNOWN[key]
    return None
