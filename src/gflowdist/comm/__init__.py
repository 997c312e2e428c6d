"""Communicators: one protocol, three engines (MPI, torch.distributed, a world of one).

Import the engines from their modules (``gflowdist.comm.mpi`` imports mpi4py,
which initialises MPI); this package only re-exports what costs nothing.
"""

from gflowdist.comm.base import MAX_TAG, AsyncSendHandle, Communicator, ReduceOp
from gflowdist.comm.local import LocalComm
from gflowdist.comm.select import (
    describe_environment,
    in_mpi_job,
    in_torch_job,
    launcher_world_size,
    release_world_comm,
    reset_world_comm,
    world_comm,
)

__all__ = [
    "AsyncSendHandle",
    "Communicator",
    "LocalComm",
    "MAX_TAG",
    "ReduceOp",
    "describe_environment",
    "in_mpi_job",
    "in_torch_job",
    "launcher_world_size",
    "release_world_comm",
    "reset_world_comm",
    "world_comm",
]
