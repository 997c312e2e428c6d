"""torchgfn's torch.distributed process group: checked, made from the launcher's variables, released.

Private helper of :mod:`gflowdist.compat.torchgfn_context` (import from
:mod:`gflowdist.compat.torchgfn`). ``initialize_distributed_compute`` makes
the default process group when none exists and a launcher announced more than
one rank: rank from the launcher's variables, ``env://`` when
``MASTER_ADDR``/``MASTER_PORT`` are set, else a ``tcp://`` address the ranks
agree on through MPI (torchgfn's mpiexec + gloo set-up). The job's session
(:class:`gflowdist.comm.session.Session`) remembers that it made the group,
and :func:`release_process_group` (the context's ``cleanup``) destroys it again.
"""

from __future__ import annotations

import logging
import os
import socket

from gflowdist.comm import in_mpi_job
from gflowdist.comm.rendezvous import reachable_address
from gflowdist.comm.session import current_session
from gflowdist.compat.torchgfn_groups import world_for
from gflowdist.engines import MPI
from gflowdist.errors import ConfigError, GflowdistError

__all__ = ["DIST_BACKENDS", "check_dist_backend", "init_process_group", "release_process_group"]

logger = logging.getLogger(__name__)

#: torch.distributed backends ``initialize_distributed_compute`` accepts (torchgfn's list).
DIST_BACKENDS = ("ccl", "mpi", "gloo")


def _first_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def check_dist_backend(dist_backend: str) -> None:
    import torch.distributed as dist

    if dist_backend not in DIST_BACKENDS:
        raise ConfigError(
            f"invalid backend {dist_backend!r}; expected one of {', '.join(DIST_BACKENDS)}", key="dist_backend"
        )
    if dist_backend == "mpi" and not dist.is_mpi_available():
        raise GflowdistError(
            "dist_backend='mpi': this torch was built without MPI support; use "
            "dist_backend='gloo' (or initialize_distributed_compute_mpi4py for MPI groups)"
        )
    if dist_backend == "ccl":
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401
        except ImportError as exc:
            raise GflowdistError(f"dist_backend='ccl' needs oneccl_bindings_for_pytorch: {exc}") from exc
    if dist_backend == "gloo" and not dist.is_gloo_available():
        raise GflowdistError("dist_backend='gloo': this torch was built without gloo")


def _rendezvous_over_mpi() -> str:
    """``tcp://address:port`` agreed through MPI: an address of rank 0's host and a port free there.

    One host: ``127.0.0.1``. Several: the first address rank 0's host name
    resolves to that is not a loopback one (the store listens on that address
    only, so ``127.0.1.1`` from ``/etc/hosts`` would be unreachable from the
    other hosts); when there is none, every rank raises :class:`ConfigError`.
    """
    mpi_world = world_for(MPI.name)
    hosts = [h.decode() for h in mpi_world.all_gather_bytes(mpi_world.host.encode())]
    mine = b""
    if mpi_world.rank == 0:
        try:
            address = "127.0.0.1" if len(set(hosts)) == 1 else reachable_address(socket.gethostname())
            with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((address, 0))
                port = probe.getsockname()[1]
            mine = f"tcp://{f'[{address}]' if ':' in address else address}:{port}".encode()
        except (OSError, ConfigError) as exc:
            mine = f"error:{exc}".encode()
    agreed = mpi_world.all_gather_bytes(mine)[0].decode()
    if agreed.startswith("error:"):
        raise ConfigError(
            f"the ranks could not agree on a rendezvous address through MPI: "
            f"{agreed[len('error:') :]}; set MASTER_ADDR and MASTER_PORT",
            key="MASTER_ADDR",
        )
    return agreed


def init_process_group(dist_backend: str, world_size: int) -> None:
    """torchgfn's process-group set-up: rank and size from the launcher's variables."""
    from datetime import timedelta

    from gflowdist.comm.rendezvous import init_default_group

    rank = _first_env("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK", "RANK")
    if rank is None or not rank.isdigit():
        raise GflowdistError(
            f"initialize_distributed_compute: the launcher announced {world_size} ranks "
            f"but no rank variable (PMI_RANK, OMPI_COMM_WORLD_RANK, RANK) was found"
        )
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        init_method = "env://"
    elif in_mpi_job():
        init_method = _rendezvous_over_mpi()  # torchgfn needs MASTER_ADDR/MASTER_PORT set by hand
    else:
        raise GflowdistError(
            "initialize_distributed_compute: set MASTER_ADDR and MASTER_PORT, or start "
            "the job with mpiexec (ranks then agree on an address through MPI)"
        )
    logger.info(
        "initializing torch.distributed (%s) as rank %s of %d via %s", dist_backend, rank, world_size, init_method
    )
    init_default_group(
        dist_backend, init_method=init_method, world_size=world_size, rank=int(rank), timeout=timedelta(minutes=5)
    )
    current_session().owns_process_group = True


def release_process_group() -> None:
    """Destroy the process group initialize_distributed_compute created (idempotent)."""
    current_session().release_process_group()
