"""Relay a launcher's stderr line by line and remember the ranks' failure lines.

``gflowdist run`` reads mpiexec's stderr through this relay. Every line is
written on to our own stderr at once; lines that start with ``gflowdist:``
are also remembered. A failing rank (``gflowdist.runtime.process.fail_job``)
writes only the first line of its message here, marked with
:data:`FAILURE_MARK`: the relay remembers it and does not print it, since the
launcher prints the whole message once, from the failure file. Once a failure
has been seen, MPICH's own line about the abort that follows
(``Abort(1) on node 0 (rank 0 in comm 0): application called MPI_Abort(...)``)
is dropped too: it says nothing the failure did not. A failure line that came
through mpiexec was written by a rank the launcher can still reach, which
matters in a network partition: the ranks on *both* sides see the other side
as lost and all of them append to the failure file (on a shared file
system), but only the launcher's side is believed. See
:func:`choose_failure`.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Sequence
from typing import IO

from gflowdist.jobenv import FAILURE_MARK

__all__ = ["StderrRelay", "choose_failure", "FAILURE_PREFIX", "FAILURE_MARK", "ABORT_NOISE"]

#: the first line of every failure message a rank writes starts with this
FAILURE_PREFIX = "gflowdist:"
#: MPICH's line for each rank that called MPI_Abort
ABORT_NOISE = re.compile(r"^Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): application called MPI_Abort")


class StderrRelay:
    """A daemon thread copying ``source`` (a binary pipe) to ``sink`` line by line.

    ``seen(line)`` tells whether a failure line (stripped) has passed through.
    """

    def __init__(self, source: IO[bytes], sink: IO[str] | None = None):
        self._source = source
        self._sink = sink if sink is not None else sys.stderr
        self._lock = threading.Lock()
        self._failure_lines: list[str] = []
        self._thread = threading.Thread(target=self._pump, daemon=True, name="gflowdist-stderr-relay")
        self._thread.start()

    def _pump(self) -> None:
        for raw in iter(self._source.readline, b""):
            line = raw.decode("utf-8", "replace")
            if line.startswith(FAILURE_MARK):
                with self._lock:
                    self._failure_lines.append(line[len(FAILURE_MARK) :].strip())
                continue
            if self._failure_lines and ABORT_NOISE.match(line):
                continue
            try:
                self._sink.write(line)
                self._sink.flush()
            except (OSError, ValueError):  # our own stderr is gone: keep reading so mpiexec never blocks
                pass
            if line.startswith(FAILURE_PREFIX):
                with self._lock:
                    self._failure_lines.append(line.strip())
        self._source.close()

    @property
    def failure_lines(self) -> list[str]:
        """The failure lines seen so far, in order."""
        with self._lock:
            return list(self._failure_lines)

    def seen(self, line: str) -> bool:
        with self._lock:
            return line.strip() in self._failure_lines

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for the rest of the stream (after mpiexec has ended)."""
        self._thread.join(timeout)


def choose_failure(messages: Sequence[str], relay: StderrRelay | None) -> str | None:
    """The failure message to print: the first whose first line came through the relay, else the first.

    ``messages`` are the failure file's entries in the order written.
    """
    if not messages:
        return None
    if relay is not None:
        for message in messages:
            if relay.seen(message.splitlines()[0]):
                return message
    return messages[0]
