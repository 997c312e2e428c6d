"""Signal handlers set attributes only (runtime/liveness.py SignalFlag, StopFlag, Deaths).

A handler that took a lock (threading.Event.set) hung a buffer when hydra's SIGUSR1 came twice, the second
inside the first handler's set: py-spy showed its main thread waiting on the Event's lock in the nested
handler, and tests/test_replace_actor.py's failing stand-in job failed 5 runs in 10, naming the live buffer
or coordinator lost. That real-rank job is the regression test of the hang (the window inside Event.set
cannot be hit on purpose); these check what the handlers do now.
"""

from __future__ import annotations

import os
import signal

from gflowdist.runtime.liveness import Deaths, SignalFlag, StopFlag
from gflowdist.runtime.process import _ignore_peer_death_signal


class _Trace:
    def __init__(self) -> None:
        self.instants: list[tuple[str, str, dict]] = []

    def instant(self, name: str, cat: str, args: dict) -> None:
        self.instants.append((name, cat, args))


class _SignalsAgain(SignalFlag):
    """A flag whose first set() raises the same signal again: its handler runs inside this set()."""

    def __init__(self, sig: int) -> None:
        super().__init__()
        self.sig, self.calls = sig, 0

    def set(self) -> None:
        self.calls += 1
        if self.calls == 1:
            os.kill(os.getpid(), self.sig)
            signal.getsignal(self.sig)  # a bytecode boundary: the pending handler runs here
        super().set()


def test_a_death_signal_inside_its_own_handler_completes_and_the_flags_hold():
    deaths = Deaths()
    again = _SignalsAgain(signal.SIGUSR1)
    deaths.unnamed = again  # type: ignore[assignment]
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        _ignore_peer_death_signal(deaths)
        os.kill(os.getpid(), signal.SIGUSR1)
        signal.getsignal(signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert again.calls == 2 and deaths.unnamed.is_set() and deaths.heard.is_set() and deaths.any
    deaths.named(3)
    assert not deaths.unnamed.is_set() and deaths.heard.is_set() and deaths.lost == {3}


def test_a_stop_signal_sets_the_reason_at_once_and_traces_it_when_a_loop_looks():
    stop, trace = StopFlag(), _Trace()
    stop.trace = trace  # type: ignore[assignment]
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGTERM)
        signal.getsignal(signal.SIGTERM)
        assert stop.reason == "signal SIGTERM" and trace.instants == []  # the handler took no lock
        os.kill(os.getpid(), signal.SIGINT)  # a second signal keeps the first reason
        signal.getsignal(signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert bool(stop) and bool(stop)
    assert trace.instants == [("stop", "stop", {"reason": "signal SIGTERM"})]


def test_a_stop_set_by_the_program_is_traced_at_once():
    stop, trace = StopFlag(), _Trace()
    stop.trace = trace  # type: ignore[assignment]
    assert not stop
    stop.set("coordinator: stop")
    stop.set("later")
    assert stop.reason == "coordinator: stop" and trace.instants == [("stop", "stop", {"reason": "coordinator: stop"})]
