"""The collector's heartbeats (:meth:`gflowdist.runtime.liveness.Liveness.heartbeat`): who gets one.

A replacement called but not heard from yet (``Liveness.starting``, faults.on_actor_loss: replace) gets none:
a spare still importing torch under load makes no MPI progress, and a beat to it every faults.heartbeat_s
filled the control channel's in-flight bound, which then failed the collector although the replacement was
only slow to start (tests/test_replace_actor.py, under a loaded machine). Once it is heard, it gets them again.
"""

from __future__ import annotations

from types import SimpleNamespace

from gflowdist.layout import Role
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
    settings = SimpleNamespace(heartbeat_s=0.0)
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
    liveness.settings.named_death_wait_s = 0.3
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
