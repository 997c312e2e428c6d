"""Picking the engine once, at start-up.

Order (unless the caller names an engine): an initialised torch.distributed
process group, else an MPI job of more than one rank (detected from the
launcher's environment variables, so a plain process never initialises MPI),
else a world of one. The choice is made once per process and cached;
:func:`describe_environment` says which launcher variables were seen, so a
job that silently fell back to a world of one is easy to diagnose.
"""

from __future__ import annotations

from gflowdist.comm.base import Communicator
from gflowdist.engines import CHOICES, LOCAL, MPI, TORCH
from gflowdist.errors import ConfigError, GflowdistError
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

_WORLD: Communicator | None = None


def world_comm(engine: str = "auto", *, cuda: bool | None = None) -> Communicator:
    """The communicator of the whole job, created on first use and cached.

    ``engine``: ``"auto"``, ``"mpi"``, ``"torch"`` or ``"local"``. ``"torch"``
    initialises the default process group from the environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) when nobody has yet, its
    rendezvous store listening on ``MASTER_ADDR`` only
    (:func:`gflowdist.comm.rendezvous.init_default_group`), with nccl when
    this rank computes on a GPU (``cuda``; None: whenever CUDA is available)
    and gloo otherwise.
    """
    global _WORLD
    if _WORLD is not None and (engine == "auto" or engine == _WORLD.engine):
        return _WORLD
    if engine not in CHOICES:
        raise ConfigError(f"unknown engine {engine!r}; expected {', '.join(CHOICES)}", key="launch.engine")
    if engine == "auto":
        engine = detect_engine()
    if engine == TORCH.name:
        import torch.distributed as dist

        from gflowdist.comm.rendezvous import init_default_group
        from gflowdist.comm.torch_dist import TorchComm

        if not dist.is_initialized():
            on_gpu = _cuda_for_local_rank() if cuda is None else cuda
            init_default_group("nccl" if on_gpu else "gloo")
        _WORLD = TorchComm()
    elif engine == MPI.name:
        from mpi4py import MPI as mpi4py

        from gflowdist.comm.mpi import MPIComm

        world = MPIComm(mpi4py.COMM_WORLD)
        mismatch = mpi_world_mismatch(world.size)
        if mismatch is not None:
            raise GflowdistError(mismatch)
        _WORLD = world
    else:
        from gflowdist.comm.local import LocalComm

        _WORLD = LocalComm()
    return _WORLD


def release_world_comm() -> None:
    """Free the cached world communicator (collective) and forget it: the end of a job's process.

    A torch world's helper threads must end before the interpreter does (see
    :meth:`gflowdist.comm.torch_dist.TorchComm.free`).
    """
    global _WORLD
    world, _WORLD = _WORLD, None
    if world is not None:
        world.free()


def reset_world_comm() -> None:
    """Forget the cached world communicator (tests; after a process group is destroyed)."""
    global _WORLD
    _WORLD = None


def detect_engine() -> str:
    """The engine :func:`world_comm` picks for ``"auto"`` (see the module docstring)."""
    import sys

    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return TORCH.name
    if in_mpi_job():
        return MPI.name
    if in_torch_job():
        return TORCH.name
    return LOCAL.name


def _cuda_for_local_rank() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0
