"""The communicators still open in this process, freed at its exit if nobody freed them.

A communicator with helper threads (:class:`~gflowdist.comm.torch_dist.TorchComm`)
registers itself when it is made and forgets itself when it is freed. At exit,
while daemon threads can still run Python (past ``atexit``, a helper thread
that returns from torch aborts the process), the ones left are freed, newest
first, within :data:`EXIT_FREE_TIMEOUT_S` in all.
"""

from __future__ import annotations

import atexit
import itertools
import time
import weakref
from typing import Any

__all__ = ["EXIT_FREE_TIMEOUT_S", "track", "forget"]

#: how long the exit hook waits, over all communicators still open, for them to free
EXIT_FREE_TIMEOUT_S = 5.0

_OPEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # communicator -> serial
_SERIALS = itertools.count()


def track(comm: Any) -> None:
    """Remember ``comm`` (it has ``free(timeout=...)``) until :func:`forget`; freed at exit otherwise."""
    _OPEN[comm] = next(_SERIALS)


def forget(comm: Any) -> None:
    _OPEN.pop(comm, None)


@atexit.register
def _free_at_exit() -> None:
    deadline = time.monotonic() + EXIT_FREE_TIMEOUT_S
    for comm in sorted(list(_OPEN.keys()), key=lambda c: _OPEN.get(c, 0), reverse=True):
        comm.free(timeout=max(0.0, deadline - time.monotonic()))
