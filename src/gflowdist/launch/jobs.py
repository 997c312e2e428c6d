"""Is this process already part of a job, and how was it started?

A launcher must never nest: ``mpiexec -n 2 python train.py`` where
``train.py`` calls ``mpi_fork(2)`` must run 2 ranks, not 4. A process is
inside a job when

- an MPI launcher started it: ``IN_MPI=1`` (set by :func:`mpi_fork`) or the
  launcher's own variables (``PMI_RANK``, ``PMI_FD``, ``PMIX_RANK``,
  ``OMPI_COMM_WORLD_RANK``, ``HYDRA_CONTROL_FD``; see
  :func:`gflowdist.comm.select.in_mpi_job`), or
- a torch launcher did (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
  ``MASTER_PORT`` all set, or ``TORCHELASTIC_RUN_ID``), or
- a torch.distributed process group is already initialised.
"""

from __future__ import annotations

import subprocess
import sys

from gflowdist.comm.select import detect_engine
from gflowdist.engines import engine_named
from gflowdist.errors import GflowdistError
from gflowdist.jobenv import find_mpiexec

__all__ = ["existing_job", "current_command", "find_mpiexec", "is_open_mpi"]


def existing_job() -> str | None:
    """``"torch"`` or ``"mpi"`` when this process is a rank of a running job, else None.

    The same detection that picks the world communicator's engine.
    """
    engine = detect_engine()
    return None if engine_named(engine).ranks_are_threads else engine


def current_command() -> list[str]:
    """The command that started this program, to run it again: same interpreter and options.

    ``python -m pkg.mod args`` gives ``[sys.executable, "-m", "pkg.mod", args...]``
    (a module stays a module, so its relative imports keep working);
    ``python script.py args`` gives ``[sys.executable, "script.py", args...]``;
    interpreter options such as ``-u`` or ``-X dev`` are kept.
    """
    original = list(getattr(sys, "orig_argv", []))
    if len(original) < len(sys.argv) or not original:
        raise GflowdistError(
            "cannot tell how this program was started (sys.orig_argv is missing); pass the command explicitly"
        )
    return [sys.executable, *original[1:]]


def is_open_mpi(mpiexec: str) -> bool:
    """True when ``mpiexec`` belongs to Open MPI (it alone needs ``--oversubscribe``)."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GflowdistError(f"cannot run {mpiexec} --version: {exc}") from exc
    text = out.stdout + out.stderr
    return "Open MPI" in text or "OpenRTE" in text
