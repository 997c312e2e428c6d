"""What a job holds of its communicators, in one object: the :class:`Session`.

A process has one current session, and on the ``local`` engine each rank's
thread has its own (:func:`bound_session`), so that ranks that are threads of
one process do not share a world, an axis or a registry. A session holds:

- the world communicator of each engine the job reached (one cache):
  :func:`gflowdist.comm.world_comm` answers with the job's world, and
  torchgfn's backend names (:mod:`gflowdist.compat.torchgfn`) with the
  world of the engine they name, the job's own or, under torchgfn's
  mpiexec + gloo set-up, the other one opened beside it (:meth:`Session.world_beside`);
- the communicators still open that run helper threads
  (:class:`~gflowdist.comm.torch_dist.TorchComm` enters itself when it is made
  and leaves when it is freed), freed at the process's exit if nobody freed them;
- the native groups (torch process groups, mpi4py communicators) and the
  communicator that owns each (:class:`~gflowdist.comm.registry.NativeGroups`,
  which :func:`gflowdist.comm.native.as_communicator` reads);
- the named axes of :mod:`gflowdist.ops.axes`;
- whether it created torch.distributed's default process group
  (:meth:`Session.owns_process_group`, set by torchgfn's
  ``initialize_distributed_compute``).

At the process's exit the communicators still open are freed, and a gloo
default group that gflowdist initialised and nobody destroyed is destroyed
(:func:`made_default_group`).

:meth:`Session.close` tears all of that down, in this order:

1. the axes are unbound (they name communicators freed next);
2. the communicators still open that are no world are freed, newest first
   (a group made from another goes before it; each sends its close notices
   over its own process group, which still exists);
3. the worlds are freed, in the reverse of the order they were opened in
   (under mpiexec + gloo the torch world, opened over the MPI one, goes first);
4. the native groups are forgotten (nothing keeps a process group past its end);
5. the default process group is destroyed, when this session created it.

How an engine's world is detected and opened, and how its native groups are
wrapped, is its descriptor's (:mod:`gflowdist.engines`); a session only
remembers what was opened.
"""

from __future__ import annotations

import atexit
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

from gflowdist.comm.base import Communicator
from gflowdist.comm.registry import NativeGroups
from gflowdist.engines import CHOICES, TORCH, detect, engine_named
from gflowdist.errors import ConfigError

__all__ = [
    "EXIT_FREE_TIMEOUT_S",
    "Session",
    "current_session",
    "bound_session",
    "close_session",
    "register",
    "unregister",
    "track",
    "forget",
    "made_default_group",
]

#: how long a closing session (the exit hook's included) waits, over all its open communicators, for them to free
EXIT_FREE_TIMEOUT_S = 5.0


class _Freeable(Protocol):
    def free(self, timeout: float = ...) -> None: ...


class Session:
    """One job's communicators: its worlds, those still open, its native groups and its axes (module docstring)."""

    def __init__(self, world: Communicator | None = None) -> None:
        #: engine name -> its world communicator, in the order they were opened
        self._worlds: dict[str, Communicator] = {}
        self._job: str | None = None  # the engine of the job's world (world_comm()'s answer)
        self._open: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # communicator -> serial
        self._serials = itertools.count()
        self._lock = threading.Lock()
        self.groups = NativeGroups()
        #: axis name -> communicator (:mod:`gflowdist.ops.axes`)
        self.axes: dict[str, Communicator] = {}
        #: this session created torch.distributed's default process group, and destroys it when it closes
        self.owns_process_group = False
        if world is not None:
            self._remember(world, job=True)

    # -- worlds ---------------------------------------------------------------
    def world(self, engine: str = "auto", *, cuda: bool | None = None) -> Communicator:
        """The job's world communicator, opened on first use (see :func:`gflowdist.comm.world_comm`).

        ``engine`` other than ``"auto"`` makes that engine's world the job's
        (opening it unless it is open already).
        """
        if engine not in CHOICES:
            raise ConfigError(f"unknown engine {engine!r}; expected {', '.join(CHOICES)}", key="launch.engine")
        if engine == "auto":
            if self._job is not None:
                return self._worlds[self._job]
            engine = detect().name
        comm = self._worlds.get(engine)
        if comm is None:
            comm = engine_named(engine).open_world(cuda=cuda)
            self._remember(comm, job=True)
        self._job = engine
        return comm

    def world_beside(self, engine: str) -> Communicator:
        """The world of ``engine``, opened beside the job's if need be; the job's world stays what it is."""
        comm = self._worlds.get(engine)
        if comm is None:
            comm = engine_named(engine).open_world()
            self._remember(comm, job=self._job is None)
        return comm

    def world_of(self, engine: str) -> Communicator | None:
        """The world of ``engine`` when this session has opened it, else None (opens nothing)."""
        return self._worlds.get(engine)

    @property
    def job_world(self) -> Communicator | None:
        """The job's world when one is open (None: :meth:`world` has not been asked yet)."""
        return None if self._job is None else self._worlds[self._job]

    def forget_world(self, engine: str) -> Communicator | None:
        """Forget (and return, unfreed) the world of ``engine``: its process group is going away."""
        comm = self._worlds.pop(engine, None)
        if self._job == engine:
            self._job = None
        return comm

    def forget_worlds(self) -> None:
        """Forget every world, freeing none (after a process group was destroyed under them; tests)."""
        self._worlds.clear()
        self._job = None

    def _remember(self, comm: Communicator, *, job: bool) -> None:
        self._worlds[comm.engine] = comm
        if job:
            self._job = comm.engine

    def release_process_group(self) -> None:
        """Free the torch world and destroy the default process group, when this session created it (collective).

        Idempotent. The other worlds stay open (an MPI world opened beside
        it); the job's world is detected again when next asked for.
        """
        if not self.owns_process_group:
            return
        self.owns_process_group = False
        torch_world = self.forget_world(TORCH.name)
        if torch_world is not None:
            torch_world.free()
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self._job = None

    # -- communicators still open -------------------------------------------------
    def track(self, comm: _Freeable) -> None:
        """Remember ``comm`` (it has ``free(timeout=...)``) until :meth:`forget`; freed when the session closes."""
        with self._lock:
            self._open[comm] = next(self._serials)

    def forget(self, comm: Any) -> None:
        with self._lock:
            self._open.pop(comm, None)

    def open_communicators(self) -> list[Any]:
        """The communicators still open (those with helper threads), newest first."""
        with self._lock:
            return sorted(self._open.keys(), key=lambda c: self._open.get(c, 0), reverse=True)

    # -- what it holds, and its end -------------------------------------------------
    def holdings(self) -> dict[str, int]:
        """How many of each thing this session holds (all 0 once closed): worlds, open, groups, axes."""
        return {
            "worlds": len(self._worlds),
            "open": len(self.open_communicators()),
            "groups": len(self.groups),
            "axes": len(self.axes),
            "process_group": int(self.owns_process_group),
        }

    def close(self, timeout: float = EXIT_FREE_TIMEOUT_S) -> None:
        """Free and forget everything, in the order of the module docstring (collective over each communicator).

        The communicators with helper threads share ``timeout`` seconds (a
        peer that never frees cannot hold the end up); the others free as
        their engines free them. Idempotent: a closed session holds nothing.
        """
        self.axes.clear()  # 1
        deadline = time.monotonic() + timeout
        worlds = list(self._worlds.values())
        still_open = self.open_communicators()
        for comm in still_open:  # 2
            if not any(comm is world for world in worlds):
                comm.free(timeout=max(0.0, deadline - time.monotonic()))
                self.forget(comm)  # even when it stays stuck (logged by its free): the session holds nothing
        self.forget_worlds()
        for world in reversed(worlds):  # 3
            if any(world is comm for comm in still_open):
                cast(_Freeable, world).free(timeout=max(0.0, deadline - time.monotonic()))
            else:
                world.free()
            self.forget(world)
        self.groups.clear()  # 4
        if self.owns_process_group:  # 5
            self.owns_process_group = False
            dist = sys.modules.get("torch.distributed")
            if dist is not None and dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()

    def free_open(self, timeout: float = EXIT_FREE_TIMEOUT_S) -> None:
        """Free the communicators still open (worlds included), newest first, within ``timeout`` in all.

        What the process's exit does: it frees no MPI communicator and destroys no
        process group (a rank may be ending alone), but a communicator's helper
        threads must end while daemon threads can still run Python.
        """
        deadline = time.monotonic() + timeout
        for comm in self.open_communicators():
            comm.free(timeout=max(0.0, deadline - time.monotonic()))


# -- the current session ---------------------------------------------------------------

_PROCESS = Session()


class _Bound(threading.local):
    """The session of a rank that is a thread (the local engine); None on any other thread."""

    # a class default: reading it on a thread that bound nothing costs no AttributeError (every
    # torchgfn send and recv asks for the current session)
    session: Session | None = None


_THREAD = _Bound()


def current_session() -> Session:
    """The session of this thread's rank: the one bound to it (:func:`bound_session`), else the process's."""
    bound = _THREAD.session
    return bound if bound is not None else _PROCESS


@contextmanager
def bound_session(session: Session) -> Iterator[Session]:
    """Make ``session`` this thread's current one while the block runs (a rank that is a thread); closed at its end."""
    previous = _THREAD.session
    _THREAD.session = session
    try:
        yield session
    finally:
        try:
            session.close()
        finally:
            _THREAD.session = previous


def close_session(timeout: float = EXIT_FREE_TIMEOUT_S) -> None:
    """Close the current session (:meth:`Session.close`); the process's starts again empty."""
    current_session().close(timeout)


# -- what the communicators call when they are made and freed -----------------------------


def register(comm: Communicator, group: Any) -> None:
    """Enter ``comm`` as the communicator over the native ``group`` in the current session (engines call this)."""
    current_session().groups.register(comm, group)


def unregister(comm: Communicator) -> None:
    """Forget ``comm`` (freed) in the current session: nothing there refers to its native group any more."""
    current_session().groups.unregister(comm)


def track(comm: _Freeable) -> None:
    """Enter ``comm`` (helper threads; ``free(timeout=...)``) among the current session's open communicators."""
    current_session().track(comm)


def forget(comm: Any) -> None:
    """Take ``comm`` (freed) out of the current session's open communicators."""
    current_session().forget(comm)


#: torch.distributed's default group when gflowdist initialised it (a weak reference; see made_default_group)
_MADE_GROUP: list[weakref.ref[Any]] = []


def made_default_group() -> None:
    """Note that gflowdist has just initialised torch.distributed's default group (``init_default_group``).

    If that group is still the default one when the process exits normally
    (no uncaught exception) and its backend is gloo, the exit destroys it,
    after the communicators still open are freed. Torch asks every script to
    call ``destroy_process_group()``; the compat layers' users (OmniSafe's
    ``fork``, torchgfn's scripts) often do not, and then a gloo worker may
    drop its last finished collective while the interpreter shuts down,
    which aborts the process ("terminate called without an active
    exception"). A group the user initialised is theirs: never destroyed here.
    nccl groups are left alone (destroying one can wait on its peers).
    """
    import torch.distributed as dist

    _MADE_GROUP[:] = [weakref.ref(dist.group.WORLD)] if dist.group.WORLD is not None else []


def _destroy_made_group() -> None:
    dist = sys.modules.get("torch.distributed")
    if not _MADE_GROUP or dist is None or not dist.is_available() or not dist.is_initialized():
        return
    made = _MADE_GROUP[0]()
    _MADE_GROUP.clear()
    if made is None or made is not dist.group.WORLD or dist.get_backend() != "gloo":
        return
    if getattr(sys, "last_value", None) is not None:  # an uncaught exception: a collective may be pending
        return
    dist.destroy_process_group()


@atexit.register
def _free_at_exit() -> None:
    # while daemon threads can still run Python (past atexit, a helper thread that returns from
    # torch aborts the process); then the default group gflowdist made, if it is still there
    _PROCESS.free_open(EXIT_FREE_TIMEOUT_S)
    _destroy_made_group()
