"""The engines a job runs on, one descriptor each: what ``launch.engine`` chooses and what each engine can do.

=========  ====================================  ===============================  ===================
engine     communicator                          ``gflowdist run`` starts ranks   goes on without a
                                                                                  lost actor
=========  ====================================  ===============================  ===================
``mpi``    mpi4py (MPICH, Open MPI)              with ``mpiexec``                 yes
``torch``  torch.distributed (gloo; nccl for     as gloo workers it spawns        no
           agent groups on GPUs of their own)
``local``  threads of one process, in-memory     as threads of its own process    no
           queues (for debuggers and tests)
=========  ====================================  ===============================  ===================

``launch.engine: auto`` lets the job's own launcher decide (a rank started by
mpiexec is on ``mpi``, one started by torchrun on ``torch``) and makes
``gflowdist run`` itself use ``mpiexec``. The config, the launcher, resume and
the fault policies ask these descriptors rather than compare names. This
module imports nothing heavy: the config loader reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Engine", "MPI", "TORCH", "LOCAL", "ENGINES", "CHOICES", "launched_engine", "engine_named"]


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

    def refuses_actor_loss_continue(self) -> str | None:
        """Why ``faults.on_actor_loss: continue`` cannot work on this engine (None: it can)."""
        return None if self.survives_lost_peer else self.no_lost_peer_because


MPI = Engine(
    "mpi",
    communicator="mpi4py",
    starts_ranks="with mpiexec",
    uses_mpiexec=True,
    ranks_are_threads=False,
    survives_lost_peer=True,
    host_averaging="mpi",
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
