"""A thin parent for each MPI rank, so one rank's kill -9 does not make hydra kill them all.

MPICH's hydra proxy, even with ``-disable-auto-cleanup``, SIGKILLs every rank
of its host when it reaps a rank that was *killed by a signal* (seen with
``strace`` on MPICH 5.0.2: ``wait4`` returns the SIGKILLed rank, then
``kill(-pgid, SIGKILL)`` for each other rank, before any of them could
notice the loss and name it). A rank that *exits*, even with status 137, does
not trigger it. So ``gflowdist run`` inside an MPI job forks at once, before
MPI or torch is loaded: the child is the rank; the parent, the keeper, only
waits for it and exits with the status a shell would report (``128 + signal``
for a signal). hydra then sees a normal exit and leaves the other ranks
alone; they miss the lost rank's heartbeats and report it by rank, role and
host.

The keeper ignores SIGINT, SIGTERM, SIGUSR1 and SIGUSR2: hydra and the
launcher signal the rank's whole process group, which the child shares, so
the child gets them directly (SIGUSR1 is hydra's "a peer died" notice, see
``_ignore_peer_death_signal`` in ``gflowdist.runtime.process``). If the keeper
itself is killed, the child gets SIGKILL too (``PR_SET_PDEATHSIG``), so
nothing outlives it; if the launcher dies, the keeper ends the rank within
a bound (see :func:`gflowdist.lifeline.keeper_wait`). Linux only; elsewhere :func:`keep` runs nothing and
the rank is the process hydra started.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

from gflowdist.cli.warm_keeper import start_warm
from gflowdist.jobenv import KEEPER_BOUND_VARIABLE, START_VARIABLE, WARM_VARIABLE, in_mpi_job, in_torch_job
from gflowdist.lifeline import keeper_wait

__all__ = ["keep", "keep_gloo_rank", "hand_over_early", "KEEPER_VARIABLE"]

#: set in the rank's environment by its keeper (its pid); the rank reads it only for diagnostics
KEEPER_VARIABLE = "GFLOWDIST_RANK_KEEPER"

_PR_SET_PDEATHSIG = 1
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def keep(bound_s: float = 60.0, *, close_pmi: bool = False) -> None:
    """Fork; return in the child (the rank). The parent waits and exits with the child's status.

    With the launcher's lifeline (:mod:`gflowdist.lifeline`), the parent SIGKILLs the child ``bound_s`` after the
    launcher died, if it is still running by then. ``close_pmi``: the parent closes its copy of hydra's PMI
    socket (``$PMI_FD``), which only the child uses: for a process started by ``MPI_Comm_spawn``, a keeper
    holding it made mpiexec end with status 141 (SIGPIPE) once the job was over.
    """
    if not sys.platform.startswith("linux") or os.environ.get(KEEPER_VARIABLE):
        return
    if not close_pmi:
        _try_warm(bound_s, by_signal=False)
    sys.stdout.flush()
    sys.stderr.flush()
    keeper = os.getpid()
    # ignored before the fork: a signal sent to the keeper as soon as the child runs (it may run first) must not
    # end it; the child takes its handlers back
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _IGNORED}
    child = os.fork()
    if child == 0:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        os.environ[KEEPER_VARIABLE] = str(keeper)
        _die_with_parent(keeper)
        return
    pmi_fd = os.environ.get("PMI_FD", "")
    if close_pmi and pmi_fd.isdigit():
        os.close(int(pmi_fd))
    status = keeper_wait(child, bound_s)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the keeper died before the prctl: follow it now
        os._exit(128 + signal.SIGKILL)


def keep_gloo_rank(bound_s: float = 60.0) -> None:
    """For a rank ``gflowdist run`` spawned itself (the torch engine): with a warm parent, have it fork the rank
    and stand in for it, ending as the rank ended, its signal included; otherwise (or refused) return, and this
    process is the rank, as before."""
    if sys.platform.startswith("linux") and not os.environ.get(KEEPER_VARIABLE):
        _try_warm(bound_s, by_signal=True)


def hand_over_early(args: Sequence[str]) -> None:
    """``gflowdist run ...`` as a rank of a launch with a warm parent: hand the rank to the warm parent before
    anything else is imported or read (the command line's parser, the config: 0.15 CPU-s a keeper), as
    :func:`keep` or :func:`keep_gloo_rank` would once the config was read. The launcher checked that config
    and put the keeper's bound (:data:`~gflowdist.jobenv.KEEPER_BOUND_VARIABLE`) beside the warm parent's
    address.

    Returns where there is nothing to hand over, and where the warm parent did not start the rank: then the
    command runs as before and its :func:`keep` forks the rank cold (the rank's log says why)."""
    warm, bound = os.environ.get(WARM_VARIABLE), os.environ.get(KEEPER_BOUND_VARIABLE, "")
    if not (warm and bound and args[:1] == ["run"] and sys.platform.startswith("linux")):
        return
    if os.environ.get(KEEPER_VARIABLE):  # the rank itself (the warm parent's fork runs the command again)
        return
    try:
        bound_s = float(bound)
    except ValueError:
        return  # not the launcher's: the command reads the bound from the config
    if in_mpi_job():
        _try_warm(bound_s, by_signal=False)
    elif in_torch_job():
        _try_warm(bound_s, by_signal=True)
    else:
        return
    del os.environ[WARM_VARIABLE]  # refused (START_VARIABLE says why): the command's keeper forks the rank cold


def _try_warm(bound_s: float, *, by_signal: bool) -> None:
    """With a warm parent (``$GFLOWDIST_WARM_PARENT``), have it fork the rank and stand in for it (this returns
    only when the rank has to start cold, and the rank's log is to say why)."""
    warm = os.environ.get(WARM_VARIABLE)
    if warm:
        why = start_warm(warm, bound_s, {KEEPER_VARIABLE: str(os.getpid())}, by_signal=by_signal)
        os.environ[START_VARIABLE] = f"cold: {why}"
