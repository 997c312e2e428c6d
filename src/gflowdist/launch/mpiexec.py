"""``mpi_fork``: re-run this program under ``mpiexec`` (Spinning Up's contract, without its bugs).

    if __name__ == "__main__":
        mpi_fork(4)          # the parent starts 4 ranks and exits with their status
        train()              # ranks (and a plain 1-process run) continue here

In the parent (``n > 1``, not inside a job), it runs

    <mpiexec> -n <n> [-bind-to core] [--oversubscribe] <python> <same options and argv>

with ``OMP_NUM_THREADS=MKL_NUM_THREADS=1`` and ``IN_MPI=1`` added to the
environment, waits, and exits with the job's status (non-zero when a rank
failed). ``<mpiexec>`` is the one next to ``sys.executable`` or on PATH;
``--oversubscribe`` is added for Open MPI only (MPICH has no such flag and
never refuses). Inside a job (see :mod:`gflowdist.launch.jobs`) or with
``n <= 1`` it returns at once, so ``mpiexec -n 2 python train.py`` runs 2
ranks, never 2 x n.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gflowdist.launch.jobs import current_command, existing_job, find_mpiexec, is_open_mpi

__all__ = ["mpi_fork", "mpi_fork_command"]


def mpi_fork_command(n: int, bind_to_core: bool = False) -> list[str]:
    """The ``mpiexec`` command line :func:`mpi_fork` runs for ``n`` ranks."""
    mpiexec = find_mpiexec()
    open_mpi = is_open_mpi(mpiexec)
    command = [mpiexec, "-n", str(int(n))]
    if bind_to_core:
        command += ["--bind-to", "core"] if open_mpi else ["-bind-to", "core"]
    if open_mpi:
        command.append("--oversubscribe")
    return command + current_command()


def mpi_fork(n: int, bind_to_core: bool = False) -> None:
    """Re-launch this program as ``n`` MPI ranks and exit with their status; no-op inside a job or for ``n <= 1``."""
    if n <= 1 or existing_job() is not None:
        return
    env = dict(os.environ, MKL_NUM_THREADS="1", OMP_NUM_THREADS="1", IN_MPI="1")
    sys.stdout.flush()
    sys.stderr.flush()
    status = subprocess.call(mpi_fork_command(n, bind_to_core), env=env)
    sys.exit(status if status >= 0 else 128 - status)  # killed by signal s: 128 + s, as a shell reports it
