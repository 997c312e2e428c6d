"""Real wirings of a small job whose ranks are threads of the test's process (the local engine's world)."""

from __future__ import annotations

import threading

from gflowdist.comm.threads import ThreadWorld
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.liveness import StopFlag
from gflowdist.runtime.wiring import Wiring
from gflowdist.timing.trace import TraceRecorder


def wirings(
    config: Config,
    size: int,
    *,
    trace: bool = False,
    timeout: float = 30.0,
    ledgers: dict[int, Ledger] | None = None,
) -> list[Wiring]:
    """One :class:`Wiring` per rank of ``config``'s layout on ``size`` thread ranks, rank ``i`` at index ``i``.

    The contexts are made on every rank at once (their layout is agreed collectively); the wirings are then
    used from the test's thread, each as its rank. With ``trace``, each rank's instants go to a trace of its own
    (``w.timer.trace``); ``ledgers``: a rank's ledger to start from (as a resumed rank's), by rank.
    """
    comms = ThreadWorld(size).comms()
    made: list[Wiring | None] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def make(rank: int) -> None:
        try:
            context = DistributedContext.create(config.layout, comm=comms[rank])
            recorder = TraceRecorder(1000) if trace else None
            ledger = (ledgers or {}).get(rank)
            made[rank] = Wiring.build(context, config, StopFlag(), trace=recorder, ledger=ledger)
        except BaseException as err:  # handed to the test's thread below
            errors[rank] = err

    threads = [threading.Thread(target=make, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"rank {threads.index(t)} did not make its wiring within {timeout} s")
    for err in errors:
        if err is not None:
            raise err
    return [w for w in made if w is not None]
