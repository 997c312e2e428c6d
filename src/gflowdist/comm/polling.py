"""Waiting without spinning a core.

MPICH's blocking ``Probe``/``Recv``/``Wait`` busy-poll at 100% CPU; on a
2-core laptop four such ranks starve each other. Every wait in gflowdist goes
through :class:`Backoff` instead: it spins for ``spin_s`` seconds (a reply
that is already on its way is caught within microseconds, which keeps
ping-pong latency close to raw MPI), then sleeps for intervals that double
from ``first_sleep_s`` up to ``max_sleep_s``. Every turn of the spin yields
the core (``sched_yield``): alone on its core the waiter keeps polling, but a
rank that waits gives its core at once to any process that can run there (on
2 cores with 2 trainers under other load, the trainers' CPU per HyperGrid step
fell from 5.8-6.8 ms to 4.5-4.6 ms and their throughput rose 1.7-2x, see
docs/performance.md). A rank that waits 3 s uses about
``spin_s`` of CPU plus one cheap check per ``max_sleep_s``, well under 5% of a
core.

A wait for a peer (a collective, a receive, a send's completion, the replay
buffer's idle loop: :func:`peer_wait`) spins for :data:`SPIN_S` while the
machine has a core for each of the job's ranks on it. Where the ranks
outnumber the cores (:func:`set_crowded`, decided once per rank at start-up
by :mod:`gflowdist.runtime.crowding`), the peer it waits for is often the
process its spin keeps off a core, and a yielding spin still counts as
runnable for the kernel's load balancer: it then spins for
:data:`CROWDED_SPIN_S` and sleeps at most :data:`CROWDED_MAX_SLEEP_S` at a
time (3 trainers + 1 buffer on 2 cores: 2,887 HyperGrid trajectories/s
against 2,408, docs/performance.md). There an MPI group's all-reduce does not wait this way at all: its
ranks sleep on doorbells (:mod:`gflowdist.comm.host_reduce`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from gflowdist.errors import DeadlineError

T = TypeVar("T")

__all__ = [
    "Backoff",
    "CROWDED_MAX_SLEEP_S",
    "CROWDED_SPIN_S",
    "SPIN_S",
    "deadline_after",
    "is_crowded",
    "peer_wait",
    "poll_until",
    "round_trip_backoff",
    "set_crowded",
]

#: a wait for a peer spins this long (plus the transfer's time at 1 GB/s) while the host has a core per rank
SPIN_S = 0.002
#: ... and this long where the job's ranks outnumber the host's cores, then sleeps at most
#: :data:`CROWDED_MAX_SLEEP_S` at a time
CROWDED_SPIN_S = 0.0003
CROWDED_MAX_SLEEP_S = 0.0005

_crowded = False


def deadline_after(timeout: float | None) -> float | None:
    """Absolute ``time.monotonic()`` deadline for a relative timeout (None: no deadline)."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout}")
    return time.monotonic() + timeout


class Backoff:
    """Spin briefly, then sleep with exponentially growing intervals.

    Call :meth:`pause` after every unsuccessful check; :meth:`reset` after
    progress.
    """

    __slots__ = ("_sleep", "_spin_until", "first_sleep_s", "max_sleep_s", "spin_s")

    def __init__(self, spin_s: float = 0.002, first_sleep_s: float = 2e-5, max_sleep_s: float = 0.002):
        if not (spin_s >= 0 and 0 < first_sleep_s <= max_sleep_s):
            raise ValueError("Backoff needs spin_s >= 0 and 0 < first_sleep_s <= max_sleep_s")
        self.spin_s = spin_s
        self.first_sleep_s = first_sleep_s
        self.max_sleep_s = max_sleep_s
        self.reset()

    def reset(self) -> None:
        self._spin_until = time.monotonic() + self.spin_s
        self._sleep = self.first_sleep_s

    def spinning_done(self) -> bool:
        """True once the spin phase is over (the wait is a long one)."""
        return time.monotonic() >= self._spin_until

    def pause(self, deadline: float | None = None) -> None:
        """Wait a little; never sleeps past ``deadline``."""
        now = time.monotonic()
        if now < self._spin_until:
            os.sched_yield()  # spinning, but any process that wants this core gets it first
            return
        delay = self._sleep
        if deadline is not None:
            delay = min(delay, max(deadline - now, 0.0))
        time.sleep(delay)
        self._sleep = min(self._sleep * 2, self.max_sleep_s)


def set_crowded(crowded: bool) -> None:
    """Whether this process's waits for peers are those of a host whose cores the job's ranks outnumber."""
    global _crowded
    _crowded = bool(crowded)


def is_crowded() -> bool:
    """What :func:`set_crowded` last said (False until it is called)."""
    return _crowded


def peer_wait(nbytes: int = 0) -> Backoff:
    """The back-off of a wait for a peer that moves ``nbytes``: spin about as long as it should take (a
    longer spin where the host has a core per rank, see the module's docstring), then sleep."""
    if _crowded:
        return Backoff(spin_s=CROWDED_SPIN_S + nbytes / 1e9, max_sleep_s=CROWDED_MAX_SLEEP_S)
    return Backoff(spin_s=SPIN_S + nbytes / 1e9)


def round_trip_backoff() -> Backoff:
    """The wait of either end of a round trip that takes milliseconds (an actor's wait for its inference
    reply, the inference rank's wait for requests): spin 0.5 ms, then sleep at most 0.2 ms, so whatever lands
    is noticed within 0.2 ms. With 1 ms sleeps, 3 actors and an inference rank on 2 idle cores made
    0.64-0.68x the env steps/s of 4 own-forward actors; with 0.2 ms 0.77-0.86x, with no more CPU per step,
    and 0.1 ms was worse (docs/performance.md, Central inference)."""
    return Backoff(spin_s=0.0005, first_sleep_s=2e-5, max_sleep_s=0.0002)


def poll_until(
    check: Callable[[], T | None],
    *,
    timeout: float | None,
    what: str,
    peer: int | None = None,
    backoff: Backoff | None = None,
) -> T:
    """Call ``check()`` until it returns something other than None.

    Raises :class:`DeadlineError` (naming ``what`` and ``peer``) after
    ``timeout`` seconds; ``timeout=None`` waits forever.
    """
    deadline = deadline_after(timeout)
    backoff = backoff or Backoff()
    while True:
        result = check()
        if result is not None:
            return result
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineError(f"{what}: no progress within {timeout:g} s", peer=peer)
        backoff.pause(deadline)
