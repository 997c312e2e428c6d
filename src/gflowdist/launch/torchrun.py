"""``fork``: OmniSafe's launcher contract on torchrun, with flags translated for it.

    if fork(parallel, device="cpu"):
        sys.exit(0)          # the parent: the workers ran and finished
    train()                  # a worker (or a plain run with parallel <= 1)

- Inside a job (see :mod:`gflowdist.launch.jobs`): make sure the job's
  communicator exists (a torch job without a process group gets one:
  ``gloo`` for ``device="cpu"``, else ``nccl``; an MPI job uses MPI), apply
  the core binding the launcher asked for, and return False.
- ``parallel > 1`` outside a job: run ``parallel`` workers with

      <python> -m torch.distributed.run --standalone --nproc-per-node <parallel>
               --no-python <python> <script and args>

  where the script and args are ``manual_args`` or this program's own
  command line (:func:`~gflowdist.launch.jobs.current_command`), wait, and
  return True. torchrun dies with this process (``PR_SET_PDEATHSIG``: SIGTERM,
  on which it ends its workers), however this process ends. ``--standalone`` puts the rendezvous on a free port.
  Its ``--log-dir`` is a temporary folder removed once it ended (plain torchrun leaves
  ``/tmp/torchelastic_XXXXXXXX`` behind in every run).
  A failing worker makes ``fork`` raise :class:`GflowdistError` with torchrun's
  exit status (torchrun stops the other workers and prints the failure).
- ``parallel <= 1``: return False.

OmniSafe passed Open MPI flags (``-bind-to core``, ``--use-hwthread-cpus``)
to torchrun, which rejects them. Here ``bind_to_core`` becomes a request to
each worker to pin itself to one core (:mod:`gflowdist.launch.binding`), and
``use_number_of_threads`` makes that one hardware thread instead of one
physical core. Without ``bind_to_core``, ``use_number_of_threads`` changes
nothing: torchrun never limits the number of workers to the core count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from gflowdist.engines import MPI, TORCH
from gflowdist.errors import GflowdistError
from gflowdist.launch.binding import BIND_VARIABLE, bind_from_environment
from gflowdist.launch.jobs import current_command, existing_job
from gflowdist.process_tree import die_with_parent

__all__ = ["fork", "torchrun_command", "ensure_process_group"]


def torchrun_command(parallel: int, program: list[str], log_dir: str | None = None) -> list[str]:
    """The torchrun command line that runs ``program`` (a full argv) as ``parallel`` local workers
    (``log_dir``: where torchrun keeps its workers' error files, its ``--log-dir``)."""
    logs = ["--log-dir", log_dir] if log_dir is not None else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(int(parallel)),
        *logs,
        "--no-python",
        *program,
    ]


def ensure_process_group(device: str = "cpu") -> str:
    """Make the communicator of the running job exist; returns its engine (``"torch"`` or ``"mpi"``)."""
    from gflowdist.comm.select import reset_world_comm, world_comm

    job = existing_job()
    if job == TORCH.name:
        import torch.distributed as dist

        from gflowdist.comm.rendezvous import init_default_group

        if not dist.is_initialized():
            init_default_group("gloo" if device == "cpu" else "nccl")
            reset_world_comm()  # a cached world of one must not outlive the new group
        world_comm(TORCH.name)
    elif job == MPI.name:
        world_comm(MPI.name)
    else:
        raise GflowdistError("ensure_process_group: this process is not part of a job")
    return job


def fork(
    parallel: int,
    bind_to_core: bool = False,
    use_number_of_threads: bool = False,
    device: str = "cpu",
    manual_args: list[str] | None = None,
) -> bool:
    """Start ``parallel`` workers and return True in the parent; False in a worker or for ``parallel <= 1``."""
    if existing_job() is not None:
        ensure_process_group(device)
        bind_from_environment()
        return False
    if parallel <= 1:
        return False
    program = [sys.executable, *list(manual_args)] if manual_args is not None else current_command()
    env = dict(os.environ, MKL_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if bind_to_core:
        env[BIND_VARIABLE] = "hwthread" if use_number_of_threads else "core"
    sys.stdout.flush()
    sys.stderr.flush()
    # torchrun ends its workers on SIGTERM: the kernel sends it one when this process dies, however it dies.
    # Its log folder (a worker's error file for a @record traceback) is ours, removed once it ended: left to
    # itself it makes /tmp/torchelastic_XXXXXXXX in every run and never removes it.
    with tempfile.TemporaryDirectory(prefix="gflowdist-torchrun-") as logs:
        status = subprocess.call(torchrun_command(parallel, program, logs), env=env, preexec_fn=die_with_parent)
    if status != 0:
        raise GflowdistError(
            f"fork({parallel}): the workers failed (torchrun exited with status {status}); "
            "the failing worker's error is printed above"
        )
    return True
