"""The collector's heartbeats (:meth:`gflowdist.runtime.liveness.Liveness.heartbeat`): who gets one; and a notice
of a death that no naming followed (:meth:`~gflowdist.runtime.liveness.Liveness.death_unnamed`).

A replacement called but not heard from yet (``Liveness.starting``, faults.on_actor_loss: replace) gets none:
a spare still importing torch under load makes no MPI progress, and a beat to it every faults.heartbeat_s
filled the control channel's in-flight bound, which then failed the collector although the replacement was
only slow to start (tests/test_replace_actor.py, under a loaded machine). Once it is heard, it gets them again.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gflowdist.errors import PeerLostError
from gflowdist.layout import Role
from gflowdist.runtime import liveness as liveness_module
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.liveness import Deaths, Liveness, StopFlag


class _Control:
    def __init__(self) -> None:
        self.sent: list[int] = []

    def isend(self, _msg_type, _body, dst: int) -> None:
        self.sent.append(dst)


def _collector(size: int = 5, actors: tuple[int, ...] = (2,)) -> tuple[Liveness, _Control]:
    layout = SimpleNamespace(coordinator=size - 1, role_of=lambda r: Role.ACTOR if r in actors else Role.TRAINER)
    context = SimpleNamespace(world=SimpleNamespace(rank=size - 1, size=size), layout=layout)
    control = _Control()
    settings = SimpleNamespace(heartbeat_s=0.0, peer_timeout_s=0.1, named_death_wait_s=0.3)
    liveness = Liveness(
        context,  # type: ignore[arg-type]
        SimpleNamespace(control=control),  # type: ignore[arg-type]
        settings,  # type: ignore[arg-type]
        StopFlag(),
        Ledger(),
        Deaths(),
        lambda *a, **k: None,
    )
    return liveness, control


def test_a_replacement_not_yet_heard_from_gets_no_beats_and_gets_them_once_it_runs():
    liveness, control = _collector()
    liveness.heartbeat(1)
    assert control.sent == [0, 1, 2, 3]
    control.sent.clear()
    liveness.starting[2] = object()  # the collector called a spare for rank 2 (gflowdist.runtime.replacing.Replacer)
    for step in range(100):
        liveness.heartbeat(step)
    assert 2 not in control.sent and control.sent.count(0) == 100
    del liveness.starting[2]  # its first heartbeat came (Replacer.heard)
    control.sent.clear()
    liveness.heartbeat(101)
    assert control.sent == [0, 1, 2, 3]


def test_the_collector_waiting_for_a_named_death_keeps_polling():
    """A trainer that is the collector waits here before its stop; its collector's poll (which names deaths and
    hears the beats) must run meanwhile, or every other rank looks silent once the wait ends."""
    liveness, _ = _collector()
    polls: list[float] = []
    liveness.poll_while_waiting(lambda: polls.append(1.0))
    liveness.deaths.signalled()  # hydra's notice, with nothing left for the collector to name
    liveness.await_named_death()
    assert len(polls) >= 5  # polled throughout the 0.3 s (every 10 ms), not only once it ended
    polls.clear()

    def name_it() -> None:  # the poll names the death: the wait ends at once
        polls.append(1.0)
        liveness.deaths.named(2)

    liveness.poll_while_waiting(name_it)
    liveness.deaths.signalled()
    liveness.await_named_death()
    assert polls == [1.0]


class _Clock:
    """Stands in for the liveness module's ``time``: ``monotonic`` reads it, ``sleep`` moves it on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(liveness_module, "time", clock)
    return clock


def test_a_notice_of_a_death_that_no_naming_follows_expires_saying_so_and_the_actors_get_beats_again(clock):
    """Hydra may say a rank died again after the collector named it (a killed rank's process, then its keeper).
    Before, that notice held every message to the actors back until the run's end (weights included), silently."""
    liveness, control = _collector()
    said: list[str] = []
    liveness.say = said.append
    liveness.deaths.signalled()
    clock.sleep(0.3)  # named_death_wait_s, not more
    liveness.heartbeat(1)
    assert control.sent == [0, 1, 3] and not liveness.may_send_to(2)  # the actor (rank 2) gets nothing meanwhile
    assert not said
    clock.sleep(0.01)  # past it, with nothing named
    assert liveness.may_send_to(2) and not liveness.deaths.unnamed.is_set()
    assert said == [
        "gflowdist: hydra said a process of this job ended 0.3 s ago, and the collector named no rank since "
        "(it names a dead rank within faults.peer_timeout_s = 0.1 of its silence): taken as a notice about a "
        "death already named; sending to the actors again"
    ]
    control.sent.clear()
    liveness.heartbeat(2)
    assert control.sent == [0, 1, 2, 3] and len(said) == 1
    assert liveness.deaths.heard.is_set()  # what was heard stays heard (the end may not wait for the lost)


def test_a_notice_that_a_naming_follows_does_not_expire_and_a_new_notice_starts_its_clock_again(clock):
    liveness, _ = _collector(actors=(2, 3))
    said: list[str] = []
    liveness.say = said.append
    liveness.deaths.signalled()
    clock.sleep(0.2)
    liveness.deaths.named(2)  # the collector named it within the time
    assert liveness.may_send_to(3)
    liveness.deaths.signalled()  # a second notice, 0.2 s after the first: its own 0.3 s count
    clock.sleep(0.2)
    assert not liveness.may_send_to(3)
    clock.sleep(0.11)
    assert liveness.may_send_to(3) and len(said) == 1


def test_waiting_for_a_named_death_ends_when_the_notice_expires(clock):
    liveness, _ = _collector()
    liveness.deaths.signalled()
    started = clock.now
    liveness.await_named_death()
    assert 0.3 < clock.now - started < 0.35 and liveness.may_send_to(2)


def test_an_actor_allows_the_longer_silence_after_its_own_notice_expired(clock):
    """The collector's notice may expire after the actor's (hydra's signals reach the ranks one by one): the
    collector's beats come back only then, so the actor keeps allowing ``silence_after_death_s``."""
    size = 4
    layout = SimpleNamespace(
        coordinator=size - 1, role_of=lambda r: Role.ACTOR if r == 2 else Role.TRAINER, host_of=lambda _r: "vm"
    )
    context = SimpleNamespace(world=SimpleNamespace(rank=2, size=size), layout=layout, placement=SimpleNamespace())
    settings = SimpleNamespace(
        heartbeat_s=0.0, peer_timeout_s=0.1, named_death_wait_s=0.2, collector_silence_s=0.1, silence_after_death_s=0.3
    )
    liveness = Liveness(
        context,  # type: ignore[arg-type]
        SimpleNamespace(control=SimpleNamespace(try_recv=lambda _source: None)),  # type: ignore[arg-type]
        settings,  # type: ignore[arg-type]
        StopFlag(),
        Ledger(),
        Deaths(),
        lambda *a, **k: None,
    )
    liveness.reset()
    liveness.deaths.signalled()
    clock.sleep(0.25)  # my notice expired (0.2 s); the collector silent for 0.25 s, more than collector_silence_s
    assert not liveness.check_control() and not liveness.deaths.unnamed.is_set()
    clock.sleep(0.04)  # 0.29 s: still within silence_after_death_s of the notice
    assert not liveness.check_control()
    clock.sleep(0.02)  # 0.31 s of silence: more than silence_after_death_s
    with pytest.raises(PeerLostError, match=r"no heartbeat for 0\.3 s"):
        liveness.check_control()
