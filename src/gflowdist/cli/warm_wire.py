"""The messages between a rank's keeper and the warm parent (:mod:`gflowdist.cli.warm_parent`).

One connection to the warm parent's abstract Unix stream socket per rank (the variable holds ``@name``). The keeper sends one request: a 4-byte
big-endian length, then that many bytes of JSON, with its file descriptors
attached to the first bytes (``SCM_RIGHTS``). The warm parent answers with
JSON lines: ``{"pid": N}`` once the rank runs (or ``{"refused": reason}``),
then ``{"status": S}`` (the rank's wait status, as ``os.waitpid`` gives it)
when it has ended. Standard library only: a keeper imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from typing import Any

from gflowdist.jobenv import START_VARIABLE, WARM_VARIABLE

__all__ = [
    "WARM_VARIABLE",
    "START_VARIABLE",
    "MAX_FDS",
    "abstract_address",
    "interpreter",
    "network_namespace",
    "send_request",
    "receive_request",
    "send_line",
    "LineReader",
]

#: descriptors one request may carry (the kernel's SCM_MAX_FD is 253)
MAX_FDS = 250
_LENGTH = struct.Struct(">I")


def network_namespace() -> str:
    """This process's network namespace (a keeper and the warm parent must share it)."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "unknown"


def interpreter() -> list[Any]:
    """This interpreter and its options (``-O``, ``-X`` ...), as a request carries them."""
    return [sys.executable, *sys.flags]


def abstract_address(name: str) -> str:
    """The address of the abstract Unix socket ``name`` (``$GFLOWDIST_WARM_PARENT`` holds ``@name``)."""
    return "\0" + name.removeprefix("@")


def send_request(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    data = json.dumps(request).encode()
    socket.send_fds(sock, [_LENGTH.pack(len(data)) + data], fds)


def receive_request(sock: socket.socket, limit: int = 16 << 20) -> tuple[dict[str, Any], list[int]]:
    """One request and the descriptors it carried (the caller owns them, also when this raises)."""
    chunk, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS)
    try:
        while len(chunk) < _LENGTH.size:
            more = sock.recv(1 << 16)
            if not more:
                raise ConnectionError("the keeper closed its socket inside a request")
            chunk += more
        (length,) = _LENGTH.unpack_from(chunk)
        if length > limit:
            raise ValueError(f"a request of {length} bytes (at most {limit})")
        data = chunk[_LENGTH.size :]
        while len(data) < length:
            more = sock.recv(min(1 << 16, length - len(data)))
            if not more:
                raise ConnectionError("the keeper closed its socket inside a request")
            data += more
        return json.loads(data[:length]), list(fds)
    except BaseException:
        for fd in fds:
            _close_quietly(fd)
        raise


def send_line(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class LineReader:
    """The JSON lines of one socket, as they arrive (non-blocking friendly: :meth:`feed` after select)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pending = b""
        self.closed = False

    def feed(self) -> list[dict[str, Any]]:
        """Read what is there (the socket is readable); the whole lines it completed."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:  # the warm parent ended before it read this keeper's request
            data = b""
        if not data:
            self.closed = True
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):  # already closed
        os.close(fd)
