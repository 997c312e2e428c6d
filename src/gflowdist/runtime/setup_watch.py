"""Liveness during setup: a rank that dies before the run starts is named at once, by rank, role and host.

Heartbeats start once every rank has finished its setup (models, data,
``--resume``'s checkpoint: up to ``faults.startup_timeout_s``). Before
this watch, a rank killed during its setup went unnoticed until that
timeout (300 s by default), and the job then blamed a rank that was alive
(``rank 3 (buffer) failed: DeadlineError: barrier: no progress within ...``).

Right after the world's layout is known, every rank tells every other its
process id and the machine it runs on (the kernel's boot id and pid
namespace, which network-namespace "hosts" of one machine share). While a
rank then waits in a collective of the setup (the start-up barrier above
all), its world communicator's wait hook looks, every
:data:`CHECK_EVERY_S`, at the processes of the ranks that share its
machine; one that has ended (or is a zombie) is reported as a
:class:`~gflowdist.errors.PeerLostError` naming its rank, role and host
and "ended during setup", and the job ends there. A rank alone on its
machine has nobody to watch it: its loss is still found by the start-up
deadline (see docs/reliability.md). The wiring's heartbeats replace this
hook when the run starts (:meth:`~gflowdist.runtime.liveness.Liveness.heartbeat_while_waiting`).
"""

from __future__ import annotations

import os
import time

from gflowdist.comm import Communicator
from gflowdist.comm.machine import boot_id
from gflowdist.context import DistributedContext
from gflowdist.errors import PeerLostError
from gflowdist.process_tree import is_running

__all__ = ["SetupWatch", "CHECK_EVERY_S", "machine_id"]

#: How often a waiting rank looks at its peers' processes.
CHECK_EVERY_S = 0.2


def machine_id() -> str:
    """Where a pid means the same process: the kernel's boot id and this process's pid namespace."""
    try:
        return f"{boot_id()}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:  # no /proc (not Linux): no peer is watched
        return f"unknown-{os.getpid()}"


class SetupWatch:
    """The peers this rank can see the processes of, and the check the wait hook runs."""

    def __init__(self, context: DistributedContext, peers: dict[int, int]):
        self.context = context
        self.peers = peers  # rank -> pid, for the ranks on my machine
        self._next = 0.0

    @classmethod
    def gather(cls, context: DistributedContext) -> SetupWatch:
        """Collective: every rank's pid and machine; returns the watch over the ranks on mine."""
        world = context.world
        mine = machine_id()
        entries = [e.decode() for e in world.all_gather_bytes(f"{os.getpid()} {mine}".encode())]
        peers = {}
        for rank, entry in enumerate(entries):
            pid, _, machine = entry.partition(" ")
            if rank != world.rank and machine == mine and pid.isdigit():
                peers[rank] = int(pid)
        return cls(context, peers)

    def install(self, world: Communicator) -> None:
        """Check while ``world`` waits in a collective (until the run's heartbeats take the hook over)."""
        world.wait_hook = self.check

    def check(self) -> None:
        """Raise :class:`PeerLostError` for a watched rank whose process has ended (at most every CHECK_EVERY_S)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + CHECK_EVERY_S
        layout = self.context.layout
        for rank, pid in self.peers.items():
            if not is_running(pid):
                raise PeerLostError(
                    rank,
                    role=layout.role_of(rank).value,
                    host=layout.host_of(rank),
                    reason=f"its process (pid {pid}) ended during setup, before the run started",
                )
