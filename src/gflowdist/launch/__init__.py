"""Starting multi-process jobs from inside a program, without ever nesting one job in another.

- :func:`mpi_fork` (Spinning Up): re-run this program under ``mpiexec``;
- :func:`fork` (OmniSafe): re-run it (or given args) under torchrun;
- :func:`launch` (VirTex): run a function as one process per device.

All three first ask :func:`existing_job`: inside a job they start nothing.

VirTex code calls ``launch(...)`` after ``from gflowdist import launch``,
and that name is also this package's, so the package itself is callable:
``gflowdist.launch(job_fn, ...)`` is :func:`gflowdist.launch.launch`.
"""

import sys
import types

from gflowdist.launch.jobs import current_command, existing_job, find_mpiexec
from gflowdist.launch.mpiexec import mpi_fork
from gflowdist.launch.spawn import DEFAULT_DIST_URL, free_port, launch, resolve_dist_url
from gflowdist.launch.threads import fair_threads, share_torch_threads
from gflowdist.launch.torchrun import ensure_process_group, fork

__all__ = [
    "current_command",
    "existing_job",
    "find_mpiexec",
    "mpi_fork",
    "DEFAULT_DIST_URL",
    "free_port",
    "launch",
    "resolve_dist_url",
    "fair_threads",
    "share_torch_threads",
    "ensure_process_group",
    "fork",
]


class _CallablePackage(types.ModuleType):
    """The ``gflowdist.launch`` package, callable as :func:`~gflowdist.launch.spawn.launch`."""

    def __call__(self, *args, **kwargs):
        return launch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
