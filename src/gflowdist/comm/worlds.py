"""How each engine's world communicator is opened and its native groups wrapped.

The engine descriptors (:mod:`gflowdist.engines`) name these functions
(``Engine.opens_world``, ``Engine.wraps_native``); nothing else calls them.
Each imports its engine when called, so naming one costs nothing.
"""

from __future__ import annotations

import sys
from typing import Any

from gflowdist.comm.base import Communicator
from gflowdist.errors import GflowdistError

__all__ = ["open_mpi_world", "open_torch_world", "open_local_world", "wrap_mpi_group", "wrap_torch_group"]


def open_mpi_world(*, cuda: bool | None = None) -> Communicator:
    """A communicator over ``MPI.COMM_WORLD``; refused when its size is not the one the launcher announced."""
    from mpi4py import MPI as mpi4py

    from gflowdist.comm.mpi import MPIComm
    from gflowdist.jobenv import mpi_world_mismatch

    world = MPIComm(mpi4py.COMM_WORLD)
    mismatch = mpi_world_mismatch(world.size)
    if mismatch is not None:
        raise GflowdistError(mismatch)
    return world


def open_torch_world(*, cuda: bool | None = None) -> Communicator:
    """A communicator over torch.distributed's default group, initialising it first when nobody has.

    It is initialised from the environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``), its rendezvous store listening on
    ``MASTER_ADDR`` only (:func:`gflowdist.comm.rendezvous.init_default_group`),
    with nccl when this rank computes on a GPU (``cuda``; None: whenever CUDA
    is available) and gloo otherwise.
    """
    import torch.distributed as dist

    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.comm.torch_dist import TorchComm

    if not dist.is_initialized():
        on_gpu = _cuda_here() if cuda is None else cuda
        init_default_group("nccl" if on_gpu else "gloo")
    return TorchComm()


def open_local_world(*, cuda: bool | None = None) -> Communicator:
    """The world of one (a plain process)."""
    from gflowdist.comm.local import LocalComm

    return LocalComm()


def wrap_mpi_group(group: Any) -> Communicator:
    """A communicator over an mpi4py intracommunicator (it is duplicated for point-to-point traffic: collective)."""
    from mpi4py import MPI as mpi4py

    from gflowdist.comm.mpi import MPIComm

    if not isinstance(group, mpi4py.Intracomm):
        raise TypeError(f"an mpi4py {type(group).__name__} cannot be used as a group: pass an Intracomm")
    return MPIComm(group)


def wrap_torch_group(group: Any) -> Communicator:
    """A communicator over a torch.distributed process group (``dist.group.WORLD`` is the world)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise GflowdistError("a torch.distributed process group was passed, but no process group is initialised")
    from gflowdist.comm.torch_dist import TorchComm

    return TorchComm(group, is_world=group is dist.group.WORLD)


def _cuda_here() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0
