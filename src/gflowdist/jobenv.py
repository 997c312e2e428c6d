"""Launcher facts: the variables a launcher and its ranks share, which launcher started this
process, which ``mpiexec`` to use, and a free port (standard library only: imports nothing heavy).

The ``gflowdist`` command uses this before deciding to re-launch itself, so a
launcher process never pays for importing torch or initialising MPI. The CLI,
the runtime, the tests and the benchmarks all take these facts from here; what
ends a launched job's processes lives beside it in :mod:`gflowdist.process_tree`.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

__all__ = [
    "MPI_SIZE_VARIABLES",
    "MPI_JOB_VARIABLES",
    "TORCH_JOB_VARIABLES",
    "LAUNCHER_PREFIXES",
    "LAUNCHER_NAMES",
    "IN_MPI_VARIABLE",
    "MPIEXEC_VARIABLE",
    "FAILURE_FILE_VARIABLE",
    "STDERR_RELAY_VARIABLE",
    "FAILURE_MARK",
    "RUN_DIR_VARIABLE",
    "RESTART_VARIABLE",
    "LAUNCH_CONFIG_VARIABLE",
    "LIFELINE_VARIABLE",
    "CONSOLE_VARIABLE",
    "WARM_VARIABLE",
    "START_VARIABLE",
    "KEEPER_BOUND_VARIABLE",
    "in_mpi_job",
    "in_torch_job",
    "launcher_world_size",
    "describe_environment",
    "mpi_world_mismatch",
    "without_launcher",
    "locate_mpiexec",
    "find_mpiexec",
    "free_port",
]

#: Environment variables by which MPI launchers announce the world size.
MPI_SIZE_VARIABLES = (
    "PMI_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_SIZE",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_SIZE",
    "SLURM_NTASKS",
)
#: Variables whose presence alone means "inside an MPI job".
MPI_JOB_VARIABLES = ("PMI_RANK", "PMI_FD", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "HYDRA_CONTROL_FD")
#: torch's ``env://`` rendezvous: all four set means "inside a torch job".
TORCH_JOB_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Set to ``1`` by gflowdist's own MPI launches (``gflowdist run``, ``mpi_fork``).
IN_MPI_VARIABLE = "IN_MPI"
#: Prefixes and names of the variables that make a process a rank of some job: a process started
#: for a job of its own (a ping, a test's job) must not inherit them from an outer one.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL")
#: The launcher (``gflowdist run``) creates the run directory and names it here for its ranks.
RUN_DIR_VARIABLE = "GFLOWDIST_RUN_DIR"
#: The launcher's record of a restart (``faults.max_restarts``), as JSON, for the ranks of the restarted job.
RESTART_VARIABLE = "GFLOWDIST_RESTART"
#: The launcher's checked, frozen config for its ranks (a file: :mod:`gflowdist.config.handoff`).
LAUNCH_CONFIG_VARIABLE = "GFLOWDIST_LAUNCH_CONFIG"
#: The launcher's lifeline, a pipe its ranks inherit (:mod:`gflowdist.lifeline`).
LIFELINE_VARIABLE = "GFLOWDIST_LIFELINE"
#: The launcher's console, for the ranks' progress line: ``tty:COLUMNS`` when its stdout is a terminal,
#: else ``pipe`` (under mpiexec a rank's own stdout is always a pipe).
CONSOLE_VARIABLE = "GFLOWDIST_CONSOLE"
#: in the ranks' environment: ``@name``, the warm parent's abstract Unix socket (gflowdist.cli.warm_parent)
WARM_VARIABLE = "GFLOWDIST_WARM_PARENT"
#: in a rank's environment: how it started ("warm: ..." or "cold: why"); its log says it
START_VARIABLE = "GFLOWDIST_RANK_START"
#: in the ranks' environment: how long a rank's keeper lets it run once the launcher is gone (``Settings.keeper_bound_s``
#: of the launcher's config), so that a keeper can hand its rank to the warm parent before reading the config
KEEPER_BOUND_VARIABLE = "GFLOWDIST_KEEPER_BOUND_S"
LAUNCHER_NAMES = (
    *TORCH_JOB_VARIABLES,
    "LOCAL_RANK",
    IN_MPI_VARIABLE,
    "TORCHELASTIC_RUN_ID",
    RUN_DIR_VARIABLE,
    RESTART_VARIABLE,
    LAUNCH_CONFIG_VARIABLE,
    LIFELINE_VARIABLE,
    CONSOLE_VARIABLE,
    KEEPER_BOUND_VARIABLE,
)
#: Names the ``mpiexec`` to use when ``launch.mpiexec`` of the config does not (see :func:`locate_mpiexec`).
MPIEXEC_VARIABLE = "GFLOWDIST_MPIEXEC"
#: The launcher (``gflowdist run``) names a file here; a failing rank appends its message, so the
#: launcher can print it even when MPI's abort kills the ranks before their stderr is forwarded.
FAILURE_FILE_VARIABLE = "GFLOWDIST_FAILURE_FILE"
#: Set to ``1`` by ``gflowdist run`` when it reads mpiexec's stderr (``cli/stderr_relay.py``): a failing rank
#: then writes only a marked first line there, and the launcher prints the failure once.
STDERR_RELAY_VARIABLE = "GFLOWDIST_STDERR_RELAY"
#: What starts that marked line: the relay remembers the line and does not print it.
FAILURE_MARK = "\x1egflowdist-failure\x1e"


def in_mpi_job() -> bool:
    """True when an MPI launcher started this process (mpiexec, mpirun, srun --mpi)."""
    if os.environ.get(IN_MPI_VARIABLE) == "1":
        return True
    return any(name in os.environ for name in MPI_JOB_VARIABLES)


def in_torch_job() -> bool:
    """True when a torch launcher (torchrun, our spawner) set the rendezvous variables."""
    return all(name in os.environ for name in TORCH_JOB_VARIABLES) or "TORCHELASTIC_RUN_ID" in os.environ


def launcher_world_size() -> int:
    """World size announced by the environment (1 when no launcher is seen)."""
    for name in ("WORLD_SIZE", *MPI_SIZE_VARIABLES):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def describe_environment() -> str:
    """One line naming the launcher variables present (for doctor and error messages)."""
    seen = [
        name
        for name in MPI_SIZE_VARIABLES + MPI_JOB_VARIABLES + TORCH_JOB_VARIABLES + ("LOCAL_RANK",)
        if name in os.environ
    ]
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
            return (
                f"MPI sees a world of {size} rank(s), but the launcher announced {name}={value}: "
                f"the processes did not join one MPI job. The mpiexec/mpirun/srun that started them "
                f"belongs to another MPI library than mpi4py's (run `gflowdist doctor`; under srun "
                f"use --mpi=pmi2 or --mpi=pmix)"
            )
    return None


def without_launcher(env: dict[str, str]) -> dict[str, str]:
    """``env`` less every variable of :data:`LAUNCHER_PREFIXES` and :data:`LAUNCHER_NAMES` (an outer job's identity)."""
    return {k: v for k, v in env.items() if not k.startswith(LAUNCHER_PREFIXES) and k not in LAUNCHER_NAMES}


def locate_mpiexec(configured: str | None = None) -> tuple[str | None, str]:
    """``(path or None, where it came from)``: gflowdist's one rule for which ``mpiexec`` to use.

    ``configured`` (``launch.mpiexec`` of a config) when set, else
    ``$GFLOWDIST_MPIEXEC``, else the ``mpiexec`` next to ``sys.executable`` (a
    venv with MPICH from PyPI), else ``mpiexec`` on ``PATH``. A
    bare command name (``mpirun``) is given as the file ``PATH`` has for it.
    The sources are ``"launch.mpiexec"``, ``MPIEXEC_VARIABLE``, ``"next to this
    Python"`` and ``"PATH"`` (with ``None`` when nothing was found).
    """
    if configured:
        return _on_path(configured), "launch.mpiexec"
    named = os.environ.get(MPIEXEC_VARIABLE)
    if named:
        return _on_path(named), MPIEXEC_VARIABLE
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside), "next to this Python"
    return shutil.which("mpiexec"), "PATH"


def _on_path(name: str) -> str:
    """A bare command name (``mpirun``) as the file PATH gives, as ``Popen`` would find it."""
    if os.sep in name:
        return name
    return shutil.which(name) or name


def find_mpiexec(configured: str | None = None) -> str:
    """The ``mpiexec`` :func:`locate_mpiexec` finds; :class:`~gflowdist.errors.ConfigError` if none."""
    path, _ = locate_mpiexec(configured)
    if path is None:
        from gflowdist.errors import ConfigError

        raise ConfigError(
            f"no mpiexec next to {sys.executable} or on PATH: `pip install mpich` (or set "
            f"launch.mpiexec or {MPIEXEC_VARIABLE} to your site's, or start the job with your "
            f"site's MPI launcher)",
            key="launch.mpiexec",
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it; never a fixed 29500)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
