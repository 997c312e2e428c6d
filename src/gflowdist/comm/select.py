"""Picking the engine once, at start-up.

Order (unless the caller names an engine): an initialised torch.distributed
process group, else an MPI job of more than one rank (detected from the
launcher's environment variables, so a plain process never initialises MPI),
else a world of one (:func:`gflowdist.engines.detect`). The choice is made
once per session (:mod:`gflowdist.comm.session`: a process, or a rank that is
a thread) and kept;
:func:`describe_environment` says which launcher variables were seen, so a
job that silently fell back to a world of one is easy to diagnose.
"""

from __future__ import annotations

from gflowdist.comm.base import Communicator
from gflowdist.comm.session import close_session, current_session
from gflowdist.engines import detect
from gflowdist.jobenv import (  # noqa: F401
    MPI_JOB_VARIABLES,
    MPI_SIZE_VARIABLES,
    describe_environment,
    in_mpi_job,
    in_torch_job,
    launcher_world_size,
    mpi_world_mismatch,
)

__all__ = [
    "world_comm",
    "launcher_world_size",
    "in_mpi_job",
    "in_torch_job",
    "release_world_comm",
    "reset_world_comm",
    "describe_environment",
    "detect_engine",
]


def world_comm(engine: str = "auto", *, cuda: bool | None = None) -> Communicator:
    """The communicator of the whole job, created on first use and kept by the current session.

    ``engine``: ``"auto"``, ``"mpi"``, ``"torch"`` or ``"local"``. ``"torch"``
    initialises the default process group from the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) when nobody has yet, its
    rendezvous store listening on ``MASTER_ADDR`` only
    (:func:`gflowdist.comm.rendezvous.init_default_group`), with nccl when
    this rank computes on a GPU (``cuda``; None: whenever CUDA is available)
    and gloo otherwise. An engine named here becomes the job's from then on.
    The world is the session's (:class:`gflowdist.comm.session.Session`): on
    the ``local`` engine, each rank's thread has its own.
    """
    return current_session().world(engine, cuda=cuda)


def release_world_comm() -> None:
    """The end of a job's process: close its session (collective), the world communicator last.

    What the job left open is freed first, newest first, then the world; a
    torch world's helper threads end before the interpreter does (see
    :meth:`gflowdist.comm.torch_dist.TorchComm.free`). Order:
    :meth:`gflowdist.comm.session.Session.close`.
    """
    close_session()


def reset_world_comm() -> None:
    """Forget the worlds the session holds, freeing none (tests; after a process group is destroyed)."""
    current_session().forget_worlds()


def detect_engine() -> str:
    """The engine :func:`world_comm` picks for ``"auto"`` (:func:`gflowdist.engines.detect`)."""
    return detect().name
