"""The warm parent: one process per job and host that imports torch once and forks the MPI ranks from it.

Every rank of a job imports torch (about 1.5 CPU-s here) and, once its
optimizer steps, ``torch._dynamo`` (about 1.2 CPU-s more): on a machine with
fewer cores than ranks that start-up is most of a short job's time. ``gflowdist
run`` therefore starts this process beside ``mpiexec``, with the ranks'
environment, and hands it a listening abstract Unix socket. It imports what every rank
imports (:data:`PRELOAD`; never ``mpi4py.MPI``, which would initialise MPI
here) and ``launch.warm_imports`` (by default ``torch._dynamo``; ``[]`` where
no rank steps a torch optimizer saves this process 1-2 CPU-s a launch), and
then serves the rank keepers (:mod:`gflowdist.cli.rank_keeper`).

A keeper is the process hydra started for a rank. Instead of forking the rank
itself, it sends the warm parent its command line, environment, working
directory, CPU affinity, umask and every open descriptor (standard streams,
hydra's PMI socket, the launcher's lifeline), plus the read end of a pipe
whose write end only it holds (:mod:`gflowdist.cli.warm_keeper`). The warm
parent checks that the rank would be the same program (same user, network
namespace, interpreter and its options, ``sys.path`` and ``PYTHON*``
variables; otherwise it refuses and the keeper forks the rank itself,
*cold*), then forks. The child takes the
keeper's descriptors at their numbers, closes every other, takes its
environment, directory, affinity and umask, starts a session of its own,
reseeds Python's and numpy's global generators, and runs ``python -m
gflowdist`` with the keeper's arguments (:func:`run_rank`): from there it is
the rank, and ends through the interpreter's normal exit.

The keeper stays the rank's stand-in for hydra: it forwards the signals
hydra and the launcher send, and exits with the rank's status, which the warm
parent sends it when it reaps the rank. If the keeper dies, the rank sees
end-of-file on the keeper's pipe and SIGKILLs itself (as ``PR_SET_PDEATHSIG``
does for a cold rank); if the warm parent dies, its ranks die with it. The
warm parent ends once ``gflowdist run`` closed its standard input (the job is
over, or the launcher died) and every rank it forked has ended. Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import secrets
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gflowdist.cli.warm_wire import (
    START_VARIABLE,
    WARM_VARIABLE,
    abstract_address,
    interpreter,
    network_namespace,
    receive_request,
    send_line,
)
from gflowdist.config.sections import WARM_IMPORTS_DEFAULT

__all__ = [
    "PRELOAD",
    "Request",
    "Started",
    "warm_wanted",
    "start_for_launch",
    "warm_parent",
    "serve",
    "run_rank",
    "main",
]

#: imported before the first fork: what every rank imports; ``launch.warm_imports`` adds the rest (by default
#: ``torch._dynamo``, which the trainers' optimizers import at their first step)
PRELOAD = ("numpy", "torch", "gflowdist.runtime.job", "gflowdist.cli.run_cmd")
_PR_SET_PDEATHSIG = 1


@dataclass
class Request:
    """What one keeper asked for, in the child that becomes its rank."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    affinity: list[int]
    umask: int
    fds: dict[int, int]  # the keeper's descriptor number -> the descriptor received for it
    keeper_line: int  # read end of the keeper's pipe: end-of-file when the keeper is gone
    module: str


def warm_wanted(setting: bool | None, nprocs: int, cores: int | None = None) -> bool:
    """``launch.warm_start``: true or false as it says; null (the default): when the job's ``nprocs`` ranks
    outnumber this host's usable ``cores``. The warm parent's import is one process's, on one core, where cold
    ranks import side by side: it pays when the ranks would otherwise queue for the cores (and CPU-seconds
    count), not on a host with a core for each rank."""
    if not sys.platform.startswith("linux") or not _pidfds_work():
        return False
    if setting is not None:
        return setting
    usable = len(os.sched_getaffinity(0)) if cores is None else cores
    return nprocs > usable


def _pidfds_work() -> bool:
    """The warm parent waits for its ranks on pidfds (Linux 5.3 and later)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def start_for_launch(
    stack: contextlib.ExitStack,
    setting: bool | None,
    nprocs: int,
    env: dict[str, str],
    imports: tuple[str, ...] = WARM_IMPORTS_DEFAULT,
) -> tuple[int, ...]:
    """Where :func:`warm_wanted`: start the warm parent on ``stack`` and point ``env`` (the ranks') to it; it
    imports ``imports`` (``launch.warm_imports``) besides :data:`PRELOAD`.

    Returns the pids the launcher's supervision is not to count as the job's (the warm parent's, or none)."""
    if not warm_wanted(setting, nprocs):
        return ()
    started = stack.enter_context(warm_parent(env, imports))
    env.update(started.variables)
    return (started.pid,)


@dataclass(frozen=True)
class Started:
    """A running warm parent, as :func:`warm_parent` yields it."""

    pid: int
    variables: dict[str, str]  # for the ranks' environment: where their keepers reach it


@contextlib.contextmanager
def warm_parent(env: dict[str, str], imports: tuple[str, ...] = WARM_IMPORTS_DEFAULT) -> Iterator[Started]:
    """For one launch (on the launcher): start the warm parent with the ranks' environment ``env``; it imports
    ``imports`` besides :data:`PRELOAD`.

    On leaving, its input is closed: it ends once every rank it forked has (it is killed after 30 s, and its
    ranks with it)."""
    # an abstract socket (Linux): no file to leave behind when the launcher is killed, reachable only from this
    # network namespace; a random name, bound before any keeper is told it; the peer's uid is checked (_refusal)
    name = f"gflowdist-warm-{os.getpid()}-{secrets.token_hex(8)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(abstract_address(name))
        listener.listen(128)
        proc = subprocess.Popen(
            [sys.executable, "-m", "gflowdist.cli.warm_parent", str(listener.fileno()), *imports],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            pass_fds=(listener.fileno(),),
            start_new_session=True,
        )
    finally:
        listener.close()  # the warm parent holds it now (or nobody does)
    try:
        yield Started(proc.pid, {WARM_VARIABLE: "@" + name})
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a rank it forked outlived its keeper's end: end them all
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    """``python -m gflowdist.cli.warm_parent FD [MODULE ...]``: import :data:`PRELOAD` and each ``MODULE``
    (``launch.warm_imports``), then serve on the listening socket at descriptor ``FD``."""
    args = sys.argv[1:] if argv is None else argv
    listener = socket.socket(fileno=int(args[0]))
    gc.disable()  # the imports make objects that live as long as this process: collecting meanwhile is wasted
    for name in PRELOAD:
        __import__(name)
    for name in args[1:]:
        try:
            __import__(name)
        except ImportError as err:  # its keepers find no warm parent: the ranks start cold, their logs say why
            raise SystemExit(
                f"gflowdist warm parent: launch.warm_imports: cannot import {name!r} ({err}); the ranks start cold"
            ) from None
    if "mpi4py.MPI" in sys.modules:  # MPI initialised here would be every child's: refuse to serve
        raise SystemExit("gflowdist warm parent: mpi4py.MPI was imported before the fork; not serving")
    if sys.modules["torch"].cuda.is_initialized():  # a CUDA context does not survive a fork
        raise SystemExit("gflowdist warm parent: CUDA was initialised before the fork; not serving")
    # out of the collector's reach: no rank's collections walk (and so copy) the ~170,000 objects it inherits
    gc.freeze()
    gc.enable()
    request = serve(listener)
    if request is None:  # served: no teardown of torch's objects (nothing here is left to flush but the streams)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return run_rank(request)


def serve(listener: socket.socket) -> Request | None:
    """Fork a rank for each keeper until standard input closes and every rank has ended.

    Returns None in this process; returns the :class:`Request` in each child, which becomes that rank."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "control")
    ranks: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, the keeper's socket)
    closing = False
    while not (closing and not ranks):
        for key, _ in selector.select():
            if key.data == "control":
                if not os.read(key.fd, 4096):  # the launcher closed it: the job is over, or it died
                    closing = True
                    selector.unregister(key.fd)
                    selector.unregister(listener)
                    listener.close()
            elif key.data == "accept":
                if closing:  # the listener was closed earlier in this round: the job is over
                    continue
                conn, _ = listener.accept()
                forked = _fork_for(conn)
                if forked is None:
                    continue
                if isinstance(forked, Request):  # the child: leave the server behind
                    selector.close()
                    listener.close()
                    for _, other in ranks.values():
                        other.close()
                    for pidfd in ranks:
                        os.close(pidfd)
                    return forked
                pidfd = os.pidfd_open(forked)
                ranks[pidfd] = (forked, conn)
                selector.register(pidfd, selectors.EVENT_READ, "rank")
            else:
                pid, conn = ranks.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # a keeper killed meanwhile reads nothing more
                    send_line(conn, {"status": status})
                conn.close()
    return None


def _fork_for(conn: socket.socket) -> Request | int | None:
    """Fork the rank ``conn``'s keeper asks for: the child's :class:`Request` in it, its pid here, or None
    (refused, the keeper told why)."""
    conn.settimeout(10.0)
    try:
        message, received = receive_request(conn)
    except (OSError, ValueError) as err:
        with contextlib.suppress(OSError):
            send_line(conn, {"refused": f"unreadable request ({err})"})
        conn.close()
        return None
    names = message["fds"]
    refused = _refusal(conn, message)
    if refused is not None or len(received) != len(names) + 1:
        for fd in received:
            os.close(fd)
        with contextlib.suppress(OSError):
            send_line(conn, {"refused": refused or "the request lost descriptors"})
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as err:  # out of processes or memory: this rank starts cold
        for fd in received:
            os.close(fd)
        with contextlib.suppress(OSError):
            send_line(conn, {"refused": f"fork failed ({err})"})
        conn.close()
        return None
    if pid == 0:
        conn.close()
        return Request(
            argv=list(message["argv"]),
            env=dict(message["env"]),
            cwd=message["cwd"],
            affinity=list(message["affinity"]),
            umask=int(message["umask"]),
            fds=dict(zip(names, received[:-1], strict=True)),
            keeper_line=received[-1],
            module=message.get("module", "gflowdist"),
        )
    for fd in received:
        os.close(fd)
    conn.settimeout(None)
    send_line(conn, {"pid": pid})
    return pid


def _refusal(conn: socket.socket, message: dict[str, Any]) -> str | None:
    """Why the rank would not be the program its keeper runs, or None."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid():
        return f"the keeper runs as uid {uid}, the warm parent as {os.getuid()}"
    if message.get("netns") != network_namespace():
        return "the keeper is on another host (network namespace) than the warm parent"
    if list(message.get("path", [])) != sys.path:
        return "the keeper's sys.path differs from the warm parent's"
    if message.get("python") != interpreter():
        return "the keeper runs another Python, or with other options (-O, -X, -u ...), than the warm parent"
    env = message.get("env", {})
    mine = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
    theirs = {k: v for k, v in env.items() if k.startswith("PYTHON")}
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()))
        return f"the keeper's PYTHON* variables differ from the warm parent's ({differ[0][0]})"
    return None


def run_rank(request: Request) -> int:
    """In the forked child: become the keeper's rank (see the module docstring) and run it."""
    import random
    import runpy

    _take_descriptors(request)
    os.environ.clear()
    os.environ.update(request.env)
    os.environ[START_VARIABLE] = f"warm: forked by the warm parent (pid {os.getppid()})"
    os.chdir(request.cwd)
    with contextlib.suppress(OSError):  # an affinity this machine cannot give: keep the parent's
        os.sched_setaffinity(0, request.affinity)
    os.umask(request.umask)
    os.setsid()
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)
    threading.Thread(target=_follow_keeper, args=(request.keeper_line,), name="keeper-line", daemon=True).start()
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    sys.argv = list(request.argv)  # run_module makes argv[0] the module's file, as ``python -m`` does
    runpy.run_module(request.module, run_name="__main__", alter_sys=True)
    return 0


def _take_descriptors(request: Request) -> None:
    """The keeper's descriptors at their numbers, every other one closed (the keeper's line kept, not inherited).

    Everything received is moved above the keeper's numbers first, the keeper's line included: it arrived at
    whatever number was free here, which may be one of the keeper's, and a ``dup2`` onto that number would
    replace it. That happened: a coordinator's line became a copy of the read end of another rank's stderr pipe
    (hydra's proxy leaks those into every process it starts after), so its watching thread ate that rank's
    stderr a byte at a time and, when that rank ended first, took it for its keeper's end and killed the
    coordinator while it wrote the run's ledger."""
    wanted = request.fds
    top = max([*wanted, 2]) + 1
    line = _above(request.keeper_line, top)
    moved = {number: _above(fd, top) for number, fd in wanted.items()}  # out of each other's way first
    for number, fd in moved.items():
        os.dup2(fd, number, inheritable=True)
        os.close(fd)
    os.set_inheritable(line, False)  # the rank's own children must not hold the keeper's line open
    request.keeper_line = line
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in wanted and fd != line:
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                os.close(fd)


def _above(fd: int, floor: int) -> int:
    """``fd`` moved to a number >= ``floor`` (the old one closed)."""
    if fd >= floor:
        return fd
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)
    os.close(fd)
    return moved


def _follow_keeper(fd: int) -> None:
    """The keeper's pipe: nothing is written; end-of-file means the keeper is gone, and so is this rank."""
    while True:
        try:
            if not os.read(fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main())
