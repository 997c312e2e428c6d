"""A rank keeper's side of a warm start: ask the job's warm parent to fork the rank, then stand in for it.

See :mod:`gflowdist.cli.warm_parent` for the whole scheme. :func:`start_warm`
either never returns (the rank ran as a child of the warm parent, and this
keeper exits with its status, as :func:`gflowdist.cli.rank_keeper.keep` does
for a rank it forked itself) or returns why the rank has to start cold: no
warm parent to reach, or one that refused (another host, another
``sys.path``). Standard library only, like the rest of a keeper.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import time

from gflowdist.cli.warm_wire import (
    MAX_FDS,
    LineReader,
    abstract_address,
    interpreter,
    network_namespace,
    send_request,
)
from gflowdist.lifeline import inherited_fd, wait_for_eof

__all__ = ["start_warm", "FORWARDED"]

#: what hydra and the launcher send a rank; a warm rank is not in its keeper's process group, so the keeper
#: passes each on (a cold rank shares the group and gets them directly)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def start_warm(
    address: str, bound_s: float, extra_env: dict[str, str], module: str = "gflowdist", *, by_signal: bool = False
) -> str:
    """Have the warm parent at ``address`` (``@name``) fork this rank (environment plus ``extra_env``); return why
    not.

    A rank killed by a signal ends this keeper with status ``128 + signal`` (what hydra must see, see
    :mod:`gflowdist.cli.rank_keeper`), or, ``by_signal``, by the same signal (a gloo rank's launcher, which
    reads the keeper's status as the rank's)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(abstract_address(address))
    except OSError as err:
        sock.close()
        return f"no warm parent at {address} ({err.strerror or err})"
    # signals that come before the rank runs are passed on once it does
    pending: list[int] = []
    rank: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        if rank:
            with contextlib.suppress(ProcessLookupError):  # the rank has just ended: its status follows
                os.kill(rank[0], sig)
        else:
            pending.append(sig)

    fds = _open_fds(exclude={sock.fileno()})
    if len(fds) >= MAX_FDS:
        sock.close()
        return f"{len(fds)} open descriptors, more than one request carries ({MAX_FDS - 1})"
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    line_read, line_write = os.pipe()  # the rank's line to me: end-of-file once I am gone
    try:
        send_request(
            sock,
            {
                "argv": sys.argv,
                "env": dict(os.environ, **extra_env),
                "cwd": os.getcwd(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "umask": _umask(),
                "fds": fds,
                "path": sys.path,
                "python": interpreter(),
                "netns": network_namespace(),
                "module": module,
            },
            [*fds, line_read],
        )
    except OSError as err:
        return _cold(sock, previous, pending, (line_read, line_write), f"the warm parent took no request ({err})")
    os.close(line_read)
    reader = LineReader(sock)
    answer = _next_message(reader)
    if answer is None or "pid" not in answer:
        why = answer.get("refused", "no answer") if answer else "it closed the socket"
        return _cold(sock, previous, pending, (line_write,), f"the warm parent did not start the rank: {why}")
    rank.append(int(answer["pid"]))
    for sig in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank[0], sig)
    status = _wait(reader, rank[0], bound_s)
    code = os.waitstatus_to_exitcode(status)
    if code < 0 and by_signal:
        sys.stdout.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(128 - code if code < 0 else code)


def _cold(sock: socket.socket, previous: dict, pending: list[int], fds: tuple[int, ...], why: str) -> str:
    """Undo the attempt: this process is as before it, and gets the signals it held back meanwhile."""
    sock.close()
    for fd in fds:
        os.close(fd)
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    for sig in pending:
        os.kill(os.getpid(), sig)
    return why


def _open_fds(exclude: set[int]) -> list[int]:
    """This process's open descriptors (those a rank it forked itself would inherit), lowest first."""
    listing = os.listdir("/proc/self/fd")  # includes the listing's own descriptor, closed by now
    fds = []
    for name in listing:
        fd = int(name)
        if fd in exclude:
            continue
        try:
            os.fstat(fd)
        except OSError:
            continue
        fds.append(fd)
    return sorted(fds)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _next_message(reader: LineReader) -> dict | None:
    while True:
        messages = reader.feed()
        if messages:
            return messages[0]
        if reader.closed:
            return None


def _wait(reader: LineReader, pid: int, bound_s: float) -> int:
    """The rank's wait status, from the warm parent; with the launcher's lifeline, the rank is SIGKILLed
    ``bound_s`` after the launcher was lost (as :func:`gflowdist.lifeline.keeper_wait` does)."""
    held = inherited_fd()
    lifeline = held[0] if held is not None else None
    lost_at: float | None = None
    killed = False
    while True:
        watched = [reader.sock.fileno()] + ([lifeline] if lifeline is not None and lost_at is None else [])
        timeout = None if lost_at is None or killed else max(lost_at + bound_s - time.monotonic(), 0.0)
        readable, _, _ = select.select(watched, [], [], timeout)
        if reader.sock.fileno() in readable:
            for message in reader.feed():
                if "status" in message:
                    return int(message["status"])
            if reader.closed:  # the warm parent is gone, and its ranks with it
                return signal.SIGKILL  # a wait status: killed by SIGKILL
        if lifeline is not None and lifeline in readable and lost_at is None and wait_for_eof(lifeline, 0):
            lost_at = time.monotonic()
        if lost_at is not None and not killed and time.monotonic() >= lost_at + bound_s:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed = True  # once; the status follows from the warm parent
