"""Which communicator owns which native group (a torch process group, an mpi4py communicator).

Every :class:`~gflowdist.comm.mpi.MPIComm` and
:class:`~gflowdist.comm.torch_dist.TorchComm` is entered in its session's
:class:`NativeGroups` when it is made (:func:`gflowdist.comm.session.register`),
so that :func:`gflowdist.comm.native.as_communicator` maps a group gflowdist
created back to the communicator that owns it. This module imports no engine
(the engines import it), so nothing here imports in a circle.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from gflowdist.comm.base import Communicator
from gflowdist.engines import MPI, TORCH

__all__ = ["native_key", "NativeGroups"]


def native_key(group: Any) -> tuple[str, int] | None:
    """The registry key of a native group (its engine's name first), or None when ``group`` is not one."""
    mpi = sys.modules.get("mpi4py.MPI")  # never imports (or initialises) MPI
    if mpi is not None and isinstance(group, mpi.Comm):
        return (MPI.name, group.handle)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(group, dist.ProcessGroup):
        return (TORCH.name, id(group))
    return None


class NativeGroups:
    """The native groups of one session and the communicator over each (a :class:`~gflowdist.comm.session.Session`'s)."""

    def __init__(self) -> None:
        #: (engine name, key) -> (the native group object, its communicator)
        self._known: dict[tuple[str, int], tuple[Any, Communicator]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._known)

    def register(self, comm: Communicator, group: Any) -> None:
        """Remember that ``comm`` is the communicator over the native ``group``."""
        key = native_key(group)
        if key is not None:
            with self._lock:
                self._known[key] = (group, comm)

    def unregister(self, comm: Communicator) -> None:
        """Forget ``comm`` (freed): nothing here refers to its native group any more."""
        with self._lock:
            for key in [key for key, (_, owner) in self._known.items() if owner is comm]:
                del self._known[key]

    def clear(self) -> None:
        """Forget every group (the session's end: no process group is kept past it)."""
        with self._lock:
            self._known.clear()

    def known(self, group: Any, key: tuple[str, int]) -> Communicator | None:
        """The live communicator registered for ``group`` (whose key is ``key``), else None."""
        with self._lock:
            entry = self._known.get(key)
        if entry is None:
            return None
        native, comm = entry
        alive = not getattr(comm, "_freed", False)
        same = native is group if key[0] == TORCH.name else (native == group and native.handle == key[1])
        if alive and same:
            return comm
        with self._lock:  # freed, or an old handle value the MPI library gave to a new communicator
            if self._known.get(key) is entry:
                del self._known[key]
        return None
