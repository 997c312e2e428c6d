"""A lifeline from ``gflowdist run`` to its job: whatever kills the launcher (SIGKILL included), the job ends.

The launcher makes a pipe and keeps its only write end; the read end is
inherited by mpiexec, hydra's proxies and every rank (hydra passes inherited
descriptors on), or by each gloo process it spawns, and named in
``$GFLOWDIST_LIFELINE`` as ``FD:pipe:[INODE]:PID``. Nothing is ever written:
when the launcher dies, however it dies, the kernel closes the write end and
every reader sees end-of-file at once. No polling of a pid (which the OS
may reuse) is involved.

On a rank, :func:`watch` starts a thread that waits for that end-of-file,
then appends a line to ``<run dir>/launcher_lost.txt``, runs the callbacks
given to :func:`on_lost` (the runtime sets the rank's stop flag: the job
stops as on a signal, checkpoint and report included, if it can) and, if
the process is still alive ``bound_s`` later, ends it. Under MPI the rank's
keeper (:mod:`gflowdist.cli.rank_keeper`, :func:`keeper_wait`) enforces the same bound from
outside the rank, with SIGKILL, so a rank stuck inside MPI holding the GIL
ends too; hydra's proxies and mpiexec end when their ranks have.

A rank on another host (started by hydra over ssh) inherits no pipe: the
descriptor number in the variable is then something else or nothing, which
:func:`inherited_fd` detects by the pipe's identity; such a rank hears the
stop from the collector, or misses it and is declared lost by heartbeats.
Standard library only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from gflowdist.jobenv import LIFELINE_VARIABLE

__all__ = [
    "LIFELINE_VARIABLE",
    "LOST_FILE",
    "LOST",
    "Lifeline",
    "inherited_fd",
    "keeper_wait",
    "on_lost",
    "wait_for_eof",
    "watch",
]

#: In the run directory: one line per rank that saw its launcher die.
LOST_FILE = "launcher_lost.txt"
#: Set on a rank once its launcher is known to be gone.
LOST = threading.Event()

_callbacks: list[Callable[[], None]] = []
_lock = threading.Lock()


class Lifeline:
    """The launcher's end: a pipe whose read end its children inherit (:attr:`fds`, :meth:`env`)."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()  # both close-on-exec; only the read end is passed on
        os.set_inheritable(self.read_fd, True)

    @property
    def fds(self) -> tuple[int, ...]:
        """For ``subprocess.Popen(pass_fds=...)``."""
        return (self.read_fd,)

    def env(self) -> dict[str, str]:
        return {LIFELINE_VARIABLE: f"{self.read_fd}:{_identity(self.read_fd)}:{os.getpid()}"}


def _identity(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def inherited_fd() -> tuple[int, int] | None:
    """``(fd, launcher pid)`` when this process holds its launcher's lifeline, else None."""
    value = os.environ.get(LIFELINE_VARIABLE, "")
    fd_text, _, rest = value.partition(":")
    identity, _, pid_text = rest.rpartition(":")
    if not fd_text.isdigit() or not pid_text.isdigit():
        return None
    fd = int(fd_text)
    if _identity(fd) != identity:  # another host, or a descriptor that is not the launcher's pipe
        return None
    return fd, int(pid_text)


def wait_for_eof(fd: int, timeout: float | None = None) -> bool:
    """True once the launcher's end is closed (within ``timeout`` s, or ever when None)."""
    import select

    readable, _, _ = select.select([fd], [], [], timeout)
    if not readable:
        return False
    try:
        return os.read(fd, 1) == b""
    except OSError:
        return True


def on_lost(callback: Callable[[], None]) -> None:
    """Run ``callback`` (from the watching thread) when the launcher is lost; at once if it already is."""
    with _lock:
        _callbacks.append(callback)
        lost = LOST.is_set()
    if lost:
        callback()


def watch(run_dir: str | None, *, who: str, bound_s: float, leftovers: tuple[str, ...] = ()) -> bool:
    """Start the watching thread (see the module docstring); False where this process has no lifeline.

    ``leftovers``: files the launcher would have removed at the end of the job (its handed-over config),
    removed here once it is lost.
    """
    held = inherited_fd()
    if held is None:
        return False
    fd, launcher = held

    def run() -> None:
        while not wait_for_eof(fd):
            pass
        LOST.set()
        _note(run_dir, f"{who}: the launcher (gflowdist run, pid {launcher}) is gone; stopping within {bound_s:g} s")
        for leftover in leftovers:
            try:
                os.unlink(leftover)
            except OSError:  # another rank was first
                pass
        with _lock:
            callbacks = list(_callbacks)
        for callback in callbacks:
            callback()
        time.sleep(bound_s)
        _note(run_dir, f"{who}: not ended {bound_s:g} s after the launcher was lost: exiting now")
        os._exit(1)

    threading.Thread(target=run, name="gflowdist-lifeline", daemon=True).start()
    return True


def _note(run_dir: str | None, text: str) -> None:
    """``text`` in the run directory's :data:`LOST_FILE` and this rank's log (not on stderr: a write to an
    mpiexec whose reader, the launcher, is gone could end it with SIGPIPE before the ranks have stopped)."""
    logging.getLogger("gflowdist.runtime").warning("%s", text)
    if run_dir:
        try:
            with open(os.path.join(run_dir, LOST_FILE), "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        except OSError:
            pass


def keeper_wait(child: int, bound_s: float) -> int:
    """A rank keeper's wait for its ``child`` (the rank): its wait status, as ``os.waitpid`` gives it.

    Without a lifeline, a plain wait. With one, the keeper also watches it:
    ``bound_s`` after the launcher is lost the child is SIGKILLed, if it
    has not ended by then (the keeper's own end then kills nothing more: its
    rank is gone).
    """
    held = inherited_fd()
    if held is None:
        return os.waitpid(child, 0)[1]  # retried on EINTR (PEP 475)
    import select
    import signal

    fd = held[0]
    try:
        pidfd: int | None = os.pidfd_open(child)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): look at the child every 0.2 s
        pidfd = None
    lost_at: float | None = None
    while True:
        watched = ([fd] if lost_at is None else []) + ([pidfd] if pidfd is not None else [])
        timeout = 0.2 if pidfd is None else None
        if lost_at is not None:
            left = max(lost_at + bound_s - time.monotonic(), 0.0)
            timeout = left if timeout is None else min(timeout, left)
        readable, _, _ = select.select(watched, [], [], timeout)
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return status
        if fd in readable and lost_at is None and wait_for_eof(fd, 0):
            lost_at = time.monotonic()
        if lost_at is not None and time.monotonic() >= lost_at + bound_s:
            os.kill(child, signal.SIGKILL)
            return os.waitpid(child, 0)[1]
