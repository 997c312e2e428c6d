"""The spare actors of ``faults.on_actor_loss: replace``: started at the job's start-up, watched while they wait.

Every wait on a process of MPI's dynamic processes happens at start-up, while
nothing trains: there, the job's ranks other than actors (the collector, the
trainers, the buffers) make a communicator of their own
(``MPI_Comm_create_group``: the actors take no part) and call
``MPI_Comm_spawn`` on it together (:func:`start_spares`), which starts
``min(faults.max_restarts, actors)`` spare processes,
``python -m gflowdist.standin``. The spawn returns one intercommunicator to
all of them: each spare reaches every one of them through it, by its rank in
that group, and nobody ever connects to a port. (A thread inside
``MPI_Comm_spawn`` holds all of its process's MPI traffic until the new process
initialised MPI, and forever when it died before; at start-up that is bounded
by ``faults.startup_timeout_s``: past it, each spawning rank says so and ends,
and the job fails naming it.) A spare waits, its imports done, and ends with
the job when no actor was lost. While it waits it sends the collector a
heartbeat every ``faults.heartbeat_s``, on a duplicate of the intercommunicator
that only they use (:meth:`Spares.fallen_silent`): a spare silent for longer
than ``faults.peer_timeout_s`` (or that sent none within
``faults.startup_timeout_s`` of the spawn) counts as dead, and the collector
names it and never calls it
(:meth:`Replacer.watch_spares <gflowdist.runtime.replacing.Replacer.watch_spares>`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from gflowdist.layout import Layout, Role
from gflowdist.runtime.wiring import Wiring
from gflowdist.standin import SPARE_BEAT_TAG

__all__ = ["Spares", "start_spares", "spare_count", "spawn_unsupported", "STANDIN_MODULE", "SPARES_TAG"]

log = logging.getLogger("gflowdist.runtime")

#: What the spawned process runs (``python -m``).
STANDIN_MODULE = "gflowdist.standin"

#: The ``MPI_Comm_create_group`` tag of the spawning ranks' communicator.
SPARES_TAG = 31000


def spawn_unsupported() -> str | None:
    """Why this process's MPI library cannot start a replacement (None: it can: MPI-2 dynamic processes)."""
    try:
        from mpi4py import MPI
    except ImportError as err:
        return f"mpi4py cannot be imported ({err})"
    if MPI.Get_version() < (2, 0):
        return f"the MPI library implements MPI {MPI.Get_version()[0]}, without MPI_Comm_spawn (MPI-2)"
    return None


def spare_count(layout: Layout, max_restarts: int) -> int:
    """How many spare actors a job starts: one per replacement it may make, at most one per actor."""
    return min(max_restarts, len(layout.actors))


@dataclass
class Spares:
    """The spare actors of a job (:func:`start_spares`), as every rank that spawned them sees them."""

    inter: Any  # the intercommunicator to them: the spares are its remote group
    members: list[int]  # the world ranks that spawned them, in the order of their group (a spare's peers' ranks)
    count: int
    beats: Any = None  # a duplicate of ``inter`` that carries only the idle spares' heartbeats (the collector's)
    started: float = field(default_factory=time.monotonic)  # when the spawn returned
    called: list[int] = field(default_factory=list)  # spares handed a rank so far, in order (the collector's)
    heard: dict[int, float] = field(default_factory=dict)  # spare -> its last heartbeat while idle (monotonic)
    silent: dict[int, str] = field(default_factory=dict)  # spare -> why it counts as dead (it fell silent idle)

    def idle(self) -> list[int]:
        """The spares neither called nor fallen silent, in order: the next replacement is the first."""
        return [i for i in range(self.count) if i not in self.called and i not in self.silent]

    def fallen_silent(self, grace_s: float, limit_s: float) -> Iterator[tuple[int, str]]:
        """Take the idle spares' heartbeats (the collector's, at each poll), then each idle spare newly fallen
        silent, with why, marked in :attr:`silent`: none heard within ``grace_s`` of the spawn
        (``faults.startup_timeout_s``: its first heartbeat follows its imports), or none for ``limit_s``."""
        from mpi4py import MPI

        status, beat, now = MPI.Status(), bytearray(8), time.monotonic()
        while self.beats.Iprobe(MPI.ANY_SOURCE, SPARE_BEAT_TAG, status):
            self.beats.Recv([beat, MPI.BYTE], status.Get_source(), SPARE_BEAT_TAG)
            self.heard[status.Get_source()] = now
        for index in self.idle():
            seen = self.heard.get(index)
            if seen is None and now - self.started > grace_s:
                why = f"no heartbeat within faults.startup_timeout_s ({grace_s:g} s) of its spawn"
            elif seen is not None and now - seen > limit_s:
                why = f"no heartbeat for {now - seen:.1f} s (faults.peer_timeout_s = {limit_s:g})"
            else:
                continue
            self.silent[index] = why
            yield index, why


def start_spares(w: Wiring) -> Spares | None:
    """Start the job's spare actors (``faults.on_actor_loss: replace``; see the module docstring), from every rank
    but the actors, together; None on an actor, or when the job starts none.

    Collective over the ranks that are not actors; within ``faults.startup_timeout_s``, else this process says
    so and ends (exit status 1): MPI's spawn never returns when a new process died before it initialised MPI.
    """
    layout, settings = w.context.layout, w.settings
    count = spare_count(layout, settings.max_restarts)
    if settings.on_actor_loss != "replace" or count == 0 or layout.role_of(w.rank) is Role.ACTOR:
        return None
    why = spawn_unsupported()
    if why is not None:
        raise RuntimeError(f"faults.on_actor_loss: replace cannot start spare actors: {why}")
    from mpi4py import MPI

    members = [r for r in range(w.comm.size) if layout.role_of(r) is not Role.ACTOR]
    world = w.comm.mpi_comm  # type: ignore[attr-defined]  # an MPIComm: the engine allows replace
    watchdog = threading.Timer(settings.startup_timeout_s, _spawn_too_late, (w.rank, count, settings.startup_timeout_s))
    watchdog.daemon = True
    watchdog.start()
    group = world.Get_group().Incl(members)
    comm = world.Create_group(group, SPARES_TAG)
    group.Free()
    info = MPI.Info.Create()
    info.Set("wdir", os.getcwd())
    root = members.index(w.collector) if w.collector in members else 0
    # a spare ends once the processes that spawned it (those on its host) have ended; it sends its heartbeats
    # to the collector (its rank in the spawning group: root) every faults.heartbeat_s while idle
    pids = comm.allgather(f"{socket.gethostname()}:{os.getpid()}")
    args = ["-m", STANDIN_MODULE, ",".join(pids), str(root), repr(settings.heartbeat_s)]
    try:
        inter = comm.Spawn(sys.executable, args=args, maxprocs=count, info=info, root=root)
        beats = inter.Dup()  # collective with the spares too: their heartbeats never meet a channel's probe
    finally:
        watchdog.cancel()
        info.Free()
        comm.Free()
    log.info("%d spare actor(s) started with MPI_Comm_spawn", count)
    return Spares(inter, members, count, beats)


def _spawn_too_late(rank: int, count: int, seconds: float) -> None:
    """The start-up spawn did not return in time (this thread runs while MPI is held): say so, end this process."""
    sys.stderr.write(
        f"gflowdist: rank {rank}: the {count} spare actor(s) of faults.on_actor_loss: replace did not start within "
        f"faults.startup_timeout_s ({seconds:g} s): MPI_Comm_spawn never returns when a new process ends before it "
        f"initialised MPI; ending\n"
    )
    sys.stderr.flush()
    os._exit(1)
