"""The end of a rank's process: its exit handlers, its output, and nothing of the interpreter's teardown.

Once a rank's job is over (its final report sent, the world communicator
freed, ``MPI_Finalize`` called) nothing the process still holds matters, but
a normal interpreter exit would spend longer than the job's last step
unloading it: the garbage collection and module teardown of torch (and of
``torch._dynamo``, which every ``torch.optim`` optimizer imports, with sympy)
took 0.45 CPU-s for a process that only imported torch and 0.85 CPU-s for a
trainer, measured on this project's 2-core machine; on 2 cores four ranks
ending at once pay it in wall time. :func:`run_then_end` therefore ends the
process the way ``multiprocessing`` ends its workers: the non-daemon
threads are joined (as at any interpreter exit), every :mod:`atexit`
handler runs (the rank's log is flushed and closed there, by
:func:`logging.shutdown`; a user's handlers run too), MPI is finalised if
it is not yet (as mpi4py's own exit hook would), stdout and stderr are
flushed, and :func:`os._exit` ends the process with the job's status.

What is skipped is the interpreter's own teardown: objects still referenced
at exit are not finalised, so a file a user's role opened and never closed
loses what its buffer holds (close files in the role, or register an
:mod:`atexit` handler). The bound on a rank's end (``end_within`` in
:mod:`gflowdist.runtime.process`) still holds while the threads are joined.

Only the torch engine's ranks end this way. An MPI rank ends through the
interpreter's exit: under a plain ``mpiexec`` (hydra's auto-cleanup on, as a
user's own ``mpiexec -n 3 gflowdist run CONFIG`` has it), ranks that ended
this promptly after ``MPI_Finalize`` were killed by hydra (exit code 9) in 2
runs of 3 of ``tests/test_config_limits.py::test_ranks_run_the_config_the_launcher_handed_them``;
with the interpreter's exit, 4 of 4 passed. The likely cause is that the proxy
sees the rank's keeper exit before it has read the rank's finalize.

An MPI rank's interpreter exit is made cheaper instead (:func:`freeze_for_exit`):
the objects alive at the job's end are moved out of the garbage collector's
reach, so the collections of the teardown do not walk torch's few hundred
thousand objects again. Everything else of the exit is as usual (atexit
handlers, modules cleared, each object freed when its last reference goes);
what is skipped is finalising *reference cycles* among those objects, which
no interpreter promises at exit. Measured on this project's 2-core machine,
a process holding torch, mpi4py, gflowdist and an Adam optimizer spent 0.46
CPU-s after its atexit handlers, 0.14 CPU-s with the objects frozen.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

__all__ = ["run_then_end", "end_now", "exit_status", "finalize_mpi", "freeze_for_exit"]


def run_then_end(run: Callable[..., int], *args: object) -> NoReturn:
    """``run(*args)`` (a rank's job), then :func:`end_now` with its status (a ``SystemExit``'s too).

    Any other exception propagates as before: the command prints it and the interpreter ends as usual.
    """
    try:
        code = run(*args)
    except SystemExit as exit_request:
        code = exit_status(exit_request.code)
    end_now(code)


def exit_status(code: object) -> int:
    """The status the interpreter gives ``SystemExit(code)``: None is 0, an int itself, anything else is printed
    on stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        sys.stderr.write(f"{code}\n")
    except (OSError, ValueError):
        pass
    return 1


def end_now(code: int) -> NoReturn:
    """End this process with ``code``: non-daemon threads joined, :mod:`atexit` handlers run, output flushed,
    no interpreter teardown (see the module docstring)."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon and thread.is_alive():
            thread.join()
    atexit._run_exitfuncs()
    finalize_mpi()  # mpi4py would at the very end of the interpreter's exit (a C-level exit hook)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # the reader is gone, or the stream was closed
            pass
    os._exit(code & 0xFF)  # as the interpreter's exit: -1 is 255


def finalize_mpi() -> None:
    """``MPI_Finalize``, where mpi4py initialised MPI and nobody finalised it yet (an MPI rank only).

    A rank whose job ended calls it itself, while the bound on its process's end still holds: mpi4py would
    call it at the very end of the interpreter's exit, after Python cancelled faulthandler's timer, and with a
    lost rank it never returns (``gflowdist.runtime.process.end_within``).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def freeze_for_exit() -> None:
    """Move every object alive now out of the garbage collector's generations (:func:`gc.freeze`), so the
    interpreter's exit does not collect through them (see the module docstring): for the end of an MPI rank,
    whose job is over. Garbage made after this call is still collected."""
    gc.freeze()
