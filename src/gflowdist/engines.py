"""The engines a job runs on, one descriptor each: what ``launch.engine`` chooses and what each engine can do.

=========  ====================================  ===============================  ===================  ==================
engine     communicator                          ``gflowdist run`` starts ranks   goes on without a    replaces a lost
                                                                                  lost actor           actor
=========  ====================================  ===============================  ===================  ==================
``mpi``    mpi4py (MPICH, Open MPI)              with ``mpiexec``                 yes                  yes (MPI_Comm_spawn)
``torch``  torch.distributed (gloo; nccl for     as gloo workers it spawns        no                   no
           agent groups on GPUs of their own)
``local``  threads of one process, in-memory     as threads of its own process    no                   no
           queues (for debuggers and tests)
=========  ====================================  ===============================  ===================  ==================

Replacing a lost actor (``faults.on_actor_loss: replace``) needs MPI's
dynamic processes besides: ``gflowdist run`` also checks before launch that
its mpiexec is one known to support ``MPI_Comm_spawn`` (MPICH's hydra, Open
MPI), and a rank checks that its MPI library is MPI-2 or newer
(:func:`gflowdist.runtime.spares.spawn_unsupported`).

``launch.engine: auto`` lets the job's own launcher decide (a rank started by
mpiexec is on ``mpi``, one started by torchrun on ``torch``) and makes
``gflowdist run`` itself use ``mpiexec``. The config, the launcher, resume and
the fault policies ask these descriptors rather than compare names.

A descriptor also says how its engine's world is found and made: :func:`detect`
picks the engine of a process (``launch.engine: auto``),
:meth:`Engine.open_world` opens its world communicator and
:meth:`Engine.wrap_native` wraps one of its native groups (a torch process
group, an mpi4py communicator); both name a function of
:mod:`gflowdist.comm.worlds`, imported when first called. This module imports
nothing heavy: the config loader reads it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from gflowdist.comm.base import Communicator

__all__ = ["Engine", "MPI", "TORCH", "LOCAL", "ENGINES", "CHOICES", "launched_engine", "engine_named", "detect"]


@dataclass(frozen=True)
class Engine:
    """One engine: its name, how ``gflowdist run`` starts its ranks, and its capabilities."""

    name: str
    communicator: str  # what carries the messages, in words
    starts_ranks: str  # how `gflowdist run` starts the ranks, in words
    uses_mpiexec: bool  # `gflowdist run` needs an mpiexec for more than one rank
    ranks_are_threads: bool  # every rank is a thread of the launcher's process
    #: can go on without a lost actor (``faults.on_actor_loss: continue``); else why not
    survives_lost_peer: bool
    #: what carries an agent group's averaging through host memory (``mpi``, ``gloo``, ``local``)
    host_averaging: str
    #: an agent group whose trainers each have a GPU of their own can average on nccl
    averages_on_nccl: bool = False
    no_lost_peer_because: str = ""
    #: can start a new actor in place of a lost one (``faults.on_actor_loss: replace``); else why not
    replaces_lost_actor: bool = False
    no_replacement_because: str = ""
    #: the function of :mod:`gflowdist.comm.worlds` that opens this engine's world communicator
    opens_world: str = ""
    #: the function of :mod:`gflowdist.comm.worlds` that wraps one of its native groups ("": it has none)
    wraps_native: str = ""

    def open_world(self, *, cuda: bool | None = None) -> Communicator:
        """A new communicator over this engine's world (``cuda``: whether this rank computes on a GPU, None: ask torch).

        The caller remembers it: :class:`gflowdist.comm.session.Session` does.
        """
        opener = cast("Callable[..., Communicator]", _worlds_function(self.opens_world))
        return opener(cuda=cuda)

    def wrap_native(self, group: Any) -> Communicator:
        """A new communicator over ``group``, a native group of this engine (``TypeError`` if it has none)."""
        if not self.wraps_native:
            raise TypeError(f"the {self.name} engine has no native groups to wrap")
        wrapper = cast("Callable[[Any], Communicator]", _worlds_function(self.wraps_native))
        return wrapper(group)

    def refuses_actor_loss_continue(self) -> str | None:
        """Why ``faults.on_actor_loss: continue`` cannot work on this engine (None: it can)."""
        return None if self.survives_lost_peer else self.no_lost_peer_because

    def refuses_actor_loss(self, policy: str) -> str | None:
        """Why ``faults.on_actor_loss: <policy>`` cannot work on this engine (None: it can; ``fail`` always can)."""
        if policy == "continue":
            return self.refuses_actor_loss_continue()
        if policy == "replace":
            return None if self.replaces_lost_actor else self.no_replacement_because
        return None


MPI = Engine(
    "mpi",
    communicator="mpi4py",
    starts_ranks="with mpiexec",
    uses_mpiexec=True,
    ranks_are_threads=False,
    survives_lost_peer=True,
    host_averaging="mpi",
    replaces_lost_actor=True,
    opens_world="open_mpi_world",
    wraps_native="wrap_mpi_group",
)
TORCH = Engine(
    "torch",
    communicator="torch.distributed (gloo)",
    starts_ranks="as gloo workers",
    uses_mpiexec=False,
    ranks_are_threads=False,
    survives_lost_peer=False,
    host_averaging="gloo",
    averages_on_nccl=True,
    no_lost_peer_because="gloo cannot go on without a rank (its first send to the lost actor fails and ends the job)",
    no_replacement_because="a gloo group's world size is fixed when it starts: torch.distributed cannot add a "
    "process to it, nor go on without the lost one",
    opens_world="open_torch_world",
    wraps_native="wrap_torch_group",
)
LOCAL = Engine(
    "local",
    communicator="in-memory queues between threads",
    starts_ranks="as threads of one process",
    uses_mpiexec=False,
    ranks_are_threads=True,
    survives_lost_peer=False,
    host_averaging="local",
    no_lost_peer_because="its ranks are threads of one process, which cannot lose one and go on",
    no_replacement_because="its ranks are threads of one process, which cannot lose one and go on",
    opens_world="open_local_world",
)

#: Every engine by name.
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (MPI, TORCH, LOCAL)}
#: The values ``launch.engine`` and ``--engine`` accept.
CHOICES: tuple[str, ...] = ("auto", *ENGINES)


def engine_named(name: str) -> Engine:
    """The engine called ``name`` (``mpi``, ``torch`` or ``local``); ``ValueError`` for any other name."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}") from None


def launched_engine(setting: str) -> Engine:
    """The engine ``gflowdist run`` starts a job on for ``launch.engine = setting`` (``auto``: MPI, via mpiexec)."""
    return MPI if setting == "auto" else engine_named(setting)


def detect() -> Engine:
    """The engine of this process for ``launch.engine: auto``.

    In this order: torch when torch.distributed has a default process group,
    else MPI when an MPI launcher started the process (its environment
    variables: a plain process never initialises MPI), else torch when
    torchrun did, else ``local`` (a world of one).
    """
    import sys

    from gflowdist.jobenv import in_mpi_job, in_torch_job

    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return TORCH
    if in_mpi_job():
        return MPI
    if in_torch_job():
        return TORCH
    return LOCAL


def _worlds_function(name: str) -> object:
    return getattr(importlib.import_module("gflowdist.comm.worlds"), name)
