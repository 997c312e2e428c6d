"""The ``local`` engine's launcher: every rank of a job as a thread of this process.

``gflowdist run CONFIG --engine local -n 4`` (or ``launch.engine: local``)
runs the whole layout here, over a :class:`~gflowdist.comm.threads.ThreadWorld`:
the same protocol, loops, ledger, checkpoints and run directory as under
mpiexec, so a breakpoint in a role's ``rollout`` or ``loss`` stops in any
debugger and a failing rank prints one traceback. SIGINT/SIGTERM reach this
(main) thread, which sets every rank's stop flag: the clean stop of a real
job. The first rank that fails says why; the collector gathers what every
rank holds into the run directory's post-mortem (:mod:`gflowdist.runtime.postmortem`,
as under mpiexec), this launcher then says where it is and how to resume, and
the others stop at their next communicator call, silently.

What threads cannot show is left to real processes: MPI itself, a rank killed
with kill -9, several hosts, and speed (the ranks share one interpreter lock).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import FrameType
from typing import TextIO

from gflowdist.comm.session import Session, bound_session
from gflowdist.comm.threads import ThreadComm, ThreadWorld
from gflowdist.config import Config
from gflowdist.runtime.failures import tell_where

__all__ = ["run_in_process"]

#: How often the launcher's thread wakes while the ranks run (a signal is handled at the next wake-up).
JOIN_POLL_S = 0.2


def run_in_process(config: Config, nprocs: int, *, resume_dir: str | None = None, out: TextIO | None = None) -> int:
    """Run ``config`` with ``nprocs`` ranks as threads; the job's exit status.

    0 when it ran to its end; the failing rank's code when one failed; 130 or 143 when SIGINT or SIGTERM
    stopped it cleanly (as ``gflowdist run`` reports a signalled mpiexec job).
    """
    from gflowdist.runtime.job import run_job  # heavy: loaded when a job runs

    world = ThreadWorld(nprocs)
    codes: dict[int, int] = {}
    started = time.time()

    def rank_main(rank: int, comm: ThreadComm) -> None:
        threading.current_thread().gflowdist_rank = rank  # type: ignore[attr-defined]  # its log's filter
        try:
            # its own session: its world is its thread communicator (ops' group=None included), its axes
            # are its own, and all of it is closed when the rank ends
            with bound_session(Session(world=comm)):
                run_job(config, resume_dir=resume_dir, comm=comm, out=out if out is not None else sys.stdout)
        except SystemExit as ended:  # fail_job's end of this rank (or of the job, by another rank)
            codes[rank] = ended.code if isinstance(ended.code, int) else 1

    threads = [
        threading.Thread(target=rank_main, args=(rank, comm), name=f"gflowdist-rank-{rank}", daemon=True)
        for rank, comm in enumerate(world.comms())
    ]

    interrupted: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        interrupted.append(signum)
        world.stop_all(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_POLL_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        from gflowdist.runtime.process import close_thread_logs

        close_thread_logs()  # every rank has ended: its logs/rank-N.log is closed (nothing left to the next job)
    code = world.aborted if world.aborted is not None else max(codes.values(), default=0)
    if code != 0:
        if world.run_dir is not None:  # where the post-mortem is, and how to resume (as gflowdist run says it)
            tell_where(world.run_dir, since=started)
        return code
    return 128 + interrupted[0] if interrupted else 0  # stopped cleanly by a signal: 130 (SIGINT), 143 (SIGTERM)
