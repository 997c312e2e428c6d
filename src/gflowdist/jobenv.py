"""Which launcher started this process: environment variables only (imports nothing heavy).

The ``gflowdist`` command uses this before deciding to re-launch itself, so a
launcher process never pays for importing torch or initialising MPI.
"""

from __future__ import annotations

import os

__all__ = ["MPI_SIZE_VARIABLES", "MPI_JOB_VARIABLES", "in_mpi_job", "in_torch_job", "launcher_world_size",
           "describe_environment", "mpi_world_mismatch"]

#: Environment variables by which MPI launchers announce the world size.
MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS",
                      "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS")
#: Variables whose presence alone means "inside an MPI job".
MPI_JOB_VARIABLES = ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "HYDRA_CONTROL_FD")


def in_mpi_job() -> bool:
    """True when an MPI launcher started this process (mpiexec, mpirun, srun --mpi)."""
    if os.environ.get("IN_MPI") == "1":
        return True
    return any(name in os.environ for name in MPI_JOB_VARIABLES)


def in_torch_job() -> bool:
    """True when a torch launcher (torchrun, our spawner) set the rendezvous variables."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) \
        or "TORCHELASTIC_RUN_ID" in os.environ


def launcher_world_size() -> int:
    """World size announced by the environment (1 when no launcher is seen)."""
    for name in ("WORLD_SIZE",) + MPI_SIZE_VARIABLES:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def describe_environment() -> str:
    """One line naming the launcher variables present (for doctor and error messages)."""
    seen = [name for name in MPI_SIZE_VARIABLES + MPI_JOB_VARIABLES +
            ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK") if name in os.environ]
    return "launcher variables: " + (", ".join(seen) if seen else "none (a plain process)")


#: Variables by which an MPI launcher announces the size of *its* world (not an allocation's:
#: ``SLURM_NTASKS`` may be larger than an ``mpiexec -n`` inside it).
_MPI_WORLD_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


def mpi_world_mismatch(size: int) -> str | None:
    """Why an MPI world of ``size`` ranks is not the one the launcher started; None if it is.

    The classic case: ``mpirun`` of one MPI library starting programs linked
    against another (mpi4py built for MPICH under Open MPI's ``mpirun``). Each
    process then initialises alone, sees a world of 1, and N copies of the job
    would run side by side.
    """
    for name in _MPI_WORLD_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) != size:
            return (f"MPI sees a world of {size} rank(s), but the launcher announced {name}={value}: "
                    f"the processes did not join one MPI job. The mpiexec/mpirun/srun that started them "
                    f"belongs to another MPI library than mpi4py's (run `gflowdist doctor`; under srun "
                    f"use --mpi=pmi2 or --mpi=pmix)")
    return None
