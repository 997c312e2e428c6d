"""This rank's process, made ready for a job: signals, the world, the layout, the run directory, logs, seeds.

:func:`prepare_rank` runs on every rank before any role exists, in this order:
make each printed line one write (two ranks' lines are never glued), put the
rank on its device (``launch.devices``, before any CUDA work), the world
communicator, ignore hydra's peer-death signal, catch SIGINT/SIGTERM into a
:class:`~gflowdist.runtime.liveness.StopFlag`, build the
:class:`~gflowdist.context.DistributedContext` (collective), agree on the run
directory (``gflowdist.rundir``), start this rank's log and stack-dump
files, seed Python's ``random``, numpy's global generator and torch (:func:`~gflowdist.ops.seeds.seed_all`).
:func:`fail_job` is how any rank ends the whole job on an error (:func:`announce_failure` once, then
:func:`abort_job`; a rank whose job fails after it started writes a post-mortem between the two:
:mod:`gflowdist.runtime.postmortem`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

import torch

from gflowdist.comm import Communicator, world_comm
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.jobenv import FAILURE_FILE_VARIABLE, FAILURE_MARK, START_VARIABLE, STDERR_RELAY_VARIABLE
from gflowdist.lifeline import on_lost
from gflowdist.ops.seeds import rank_seed, seed_all
from gflowdist.rundir import agree_run_dir
from gflowdist.runtime.crowding import decide_crowding
from gflowdist.runtime.device_setup import setup_device
from gflowdist.runtime.faults import check_engine_allows
from gflowdist.runtime.liveness import Deaths, StopFlag, collector_rank
from gflowdist.runtime.setup_watch import SetupWatch

__all__ = [
    "RankProcess",
    "prepare_rank",
    "print_whole_lines",
    "fail_job",
    "announce_failure",
    "abort_job",
    "end_within",
    "end_of_process_bounded",
    "FORWARD_BEFORE_ABORT_S",
    "END_AFTER_LOSS_S",
    "END_S",
]

log = logging.getLogger("gflowdist.runtime")

#: How long a failing rank lets its stderr line travel to the launcher before it aborts the job.
FORWARD_BEFORE_ABORT_S = 0.2

#: How long the end of a rank's process (freeing the communicator, MPI_Finalize) may take after the run went on
#: without a lost rank: MPICH's MPI_Finalize waits for every rank of the world, the lost one too, forever.
END_AFTER_LOSS_S = 2.0
#: The same bound for every other run: a rank that missed the news of a loss must still end.
END_S = 60.0

_STACK_FILES: list[IO[str]] = []  # kept open for faulthandler for the life of the process


@dataclass
class RankProcess:
    """What :func:`prepare_rank` made: this rank's place in the job and its run directory."""

    context: DistributedContext
    stop: StopFlag
    deaths: Deaths  # what this process hears of deaths (faults.on_actor_loss: continue)
    run_dir: Path
    generator: torch.Generator  # seeded from run.seed and the rank
    device: str  # "cpu" or "cuda:N" (launch.devices applied): the roles' self.device
    watch: SetupWatch | None = None  # names a peer that dies during setup (installed by the job runner)
    step: Callable[[], int | None] = lambda: None  # the step a trainer is at (for failure messages)
    holding: Any = None  # what this rank holds for a post-mortem, once it runs (runtime.postmortem.Holding)

    @property
    def world(self) -> Communicator:
        return self.context.world


def prepare_rank(config: Config, resume_dir: str | None, comm: Communicator | None = None) -> RankProcess:
    """Make this process a rank of the job (collective: every rank calls it; see the module docstring)."""
    print_whole_lines()
    placed = setup_device(config.launch.devices)  # before any CUDA work, and before nccl could start
    # the world is gloo on the torch engine whatever the devices (ranks on the CPU and on GPUs share it); an agent
    # group whose trainers each have a GPU of their own averages on an nccl group of its own (DistributedContext)
    world = comm if comm is not None else world_comm(config.launch.engine, cuda=False)
    check_engine_allows(config, world.engine)
    stop, deaths = StopFlag(), Deaths()
    if world.ranks_are_threads:  # only the launcher's thread catches signals; it sets every rank's flag
        world.world.stop_flags.append(stop)  # type: ignore[attr-defined]  # a ThreadComm's ThreadWorld
    else:
        _ignore_peer_death_signal(
            deaths if config.faults.on_actor_loss != "fail" else None
        )  # after MPI_Init and its handlers
        stop.install_signal_handlers()
        on_lost(lambda: stop.set("the launcher was lost"))  # gflowdist.lifeline: stop as on a signal
    ctx = DistributedContext.create(config.layout, comm=world, device=placed.device)
    crowding = decide_crowding(world)  # how this process waits for its peers (gflowdist.runtime.crowding)
    watch = SetupWatch.gather(ctx)  # every rank's pid and machine, while every rank surely lives
    run_dir = agree_run_dir(world, config, resume_dir)
    if world.ranks_are_threads:  # the local engine's launcher says where a failed run's post-mortem is
        world.world.run_dir = run_dir  # type: ignore[attr-defined]  # a ThreadComm's ThreadWorld
    if world.rank == collector_rank(ctx.layout):
        run_dir.mkdir(parents=True, exist_ok=True)
    world.barrier(timeout=60)
    _setup_logging(run_dir, world.rank, threads=world.ranks_are_threads)
    log.info(
        "rank %d role %s host %s pid %d device %s (%s)",
        world.rank,
        ctx.role.value,
        ctx.host,
        os.getpid(),
        placed.device,
        placed.reason,
    )
    if not world.ranks_are_threads:
        log.info("started %s", os.environ.get(START_VARIABLE, "cold"))
    log.info("%s", crowding.describe())
    group = ctx.placement.group
    if ctx.role.value == "trainer" and group is not None and ctx.averaging:
        log.info("agent group %d averages through %s", group, ctx.averaging[group].describe())
    seed = rank_seed(config.run.seed, world.rank)
    seed_all(seed)  # user code drawing from any of the global generators draws the same numbers every run
    return RankProcess(ctx, stop, deaths, run_dir, torch.Generator().manual_seed(seed), placed.device, watch)


def print_whole_lines() -> None:
    """Each line a rank prints reaches the launcher in one write, so two ranks' lines are never glued.

    ``gflowdist run`` starts ranks with ``PYTHONUNBUFFERED=1`` (nothing is lost when a rank is killed); that
    also makes ``print("x")`` two writes, ``x`` and the newline, and hydra may forward another rank's line
    between them. Line buffering without write-through flushes every complete line at once.
    """
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a user's replacement stream is theirs to buffer
            stream.reconfigure(line_buffering=True, write_through=False)


def _ignore_peer_death_signal(deaths: Deaths | None = None) -> None:
    """Ignore SIGUSR1, which MPICH's hydra sends every rank when one of them dies.

    With ``-disable-auto-cleanup`` (how ``gflowdist run`` starts MPICH) a
    rank's death makes hydra's proxy send SIGUSR1 to the other ranks. Its
    default action ends them silently, and with any handler installed (a
    faulthandler dump included) about one run in three still lost every
    survivor within 0.1 s, so nobody named the lost rank. Ignored, the
    survivors go on, miss the dead rank's heartbeats and report it
    (``tests/test_runtime_jobs.py::test_kill9_of_a_rank_ends_the_job_naming_it``).
    Stack dumps therefore use SIGUSR2.

    With ``deaths`` (``faults.on_actor_loss: continue``) the signal sets
    :attr:`Deaths.unnamed <gflowdist.runtime.liveness.Deaths>` instead: a Python handler
    (a flag, nothing else), which 6 ranks of 6 in 3 runs survived with the
    rank keeper in place; ranks then stop sending to actors until the collector names
    the dead rank.
    """
    if deaths is not None:

        def note(_signum: int, _frame: object) -> None:
            deaths.signalled()

        signal.signal(signal.SIGUSR1, note)
        return
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def close_thread_logs() -> None:
    """Close the ``logs/rank-N.log`` handlers that ranks as threads added (their job has ended)."""
    root = logging.getLogger("gflowdist")
    for handler in [h for h in root.handlers if getattr(h, "gflowdist_rank", None) is not None]:
        root.removeHandler(handler)
        handler.close()


def _setup_logging(run_dir: Path, rank: int, *, threads: bool = False) -> None:
    """``logs/rank-N.log`` for the ``gflowdist`` loggers, ``logs/rank-N.stacks`` for stack dumps.

    With ranks as threads (``threads``), each rank's log takes the records of its own thread
    (:func:`thread_rank`), replacing the handler an earlier job of this process gave that rank, and stack
    dumps are the launcher's.
    """
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    if threads:
        handler = logging.FileHandler(run_dir / "logs" / f"rank-{rank}.log")
        handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(lambda record: thread_rank() == rank)
        handler.gflowdist_rank = rank  # type: ignore[attr-defined]  # marks the handler as this rank's (below)
        root = logging.getLogger("gflowdist")
        for old in [h for h in root.handlers if getattr(h, "gflowdist_rank", None) == rank]:
            root.removeHandler(old)
            old.close()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        return
    # `kill -USR2 <pid>` appends every thread's Python stack to logs/rank-N.stacks (debugging hangs).
    stacks = open(run_dir / "logs" / f"rank-{rank}.stacks", "a")
    _STACK_FILES.append(stacks)
    faulthandler.register(signal.SIGUSR2, file=stacks, all_threads=True)
    faulthandler.enable(file=stacks, all_threads=True)  # a native crash leaves its Python stack here
    handler = logging.FileHandler(run_dir / "logs" / f"rank-{rank}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("gflowdist")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def fail_job(world: Communicator, message: str, *, code: int, detail: str | None = None) -> NoReturn:
    """End the whole job from this rank: :func:`announce_failure`, then :func:`abort_job`."""
    if not world.first_to_fail():  # ranks as threads: another rank ends the job and says why
        raise SystemExit(code)
    announce_failure(message, detail=detail)
    abort_job(world, code)


def announce_failure(message: str, *, detail: str | None = None) -> None:
    """Say once why the job fails: ``message`` to the failure file, the rank's log and the console.

    ``message`` is what the console shows (a :class:`~gflowdist.runtime.failures.Failure`'s text); ``detail``
    (the whole traceback) goes to the rank's log only. The failure file (``$GFLOWDIST_FAILURE_FILE``, named by
    ``gflowdist run``) lets the launcher print the message once, even when MPI's abort kills the ranks before
    their stderr is forwarded: under such a launcher the rank's stderr gets only the marked first line the
    launcher's relay recognises (:data:`~gflowdist.jobenv.FAILURE_MARK`), or nothing on the torch engine;
    under any other launcher the whole message.
    """
    # The failure file first: if mpiexec is already gone, writing to stderr may fail.
    failure_file = os.environ.get(FAILURE_FILE_VARIABLE)
    if failure_file:
        try:
            with open(failure_file, "a") as f:
                f.write(message.rstrip() + "\n\0")
        except OSError as err:  # the run directory is not on this host: the whole message goes to stderr
            log.warning("failure file %s not written: %s", failure_file, err)
            failure_file = None
    log.error("%s", message)
    if detail is not None:
        log.error("%s", detail)
    try:
        if os.environ.get(STDERR_RELAY_VARIABLE) == "1":
            first, *rest = message.rstrip().splitlines()
            sys.stderr.write(FAILURE_MARK + first + "\n" + ("" if failure_file else "".join(f"{r}\n" for r in rest)))
        elif not failure_file:
            sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
    except OSError:  # nobody is reading our stderr any more
        pass


def abort_job(world: Communicator, code: int) -> NoReturn:
    """End every rank of the job now with exit status ``code`` (after the failure was announced)."""
    if world.size > 1:
        # MPI's abort makes the launcher kill every rank at once; hydra's proxy may handle the abort
        # before it has read (and forwarded) the failure's line, and the launcher believes a failure
        # line it has seen come through mpiexec (a partition's far side cannot send one).
        time.sleep(FORWARD_BEFORE_ABORT_S)
        world.abort(code)
    raise SystemExit(code)


def thread_rank() -> int | None:
    """The rank the calling thread works for when ranks are threads (``threading.Thread.gflowdist_rank``)."""
    return getattr(threading.current_thread(), "gflowdist_rank", None)


def end_of_process_bounded(world: Communicator, deaths: Deaths) -> None:
    """Before the communicators are freed: :func:`end_within` 2 s after a loss was heard of, else 60 s."""
    if world.size > 1 and not world.ranks_are_threads:
        end_within(END_AFTER_LOSS_S if deaths.any else END_S)
        if threading.current_thread() is threading.main_thread():
            # Python's exit gives a signal it handles its default action back, and hydra sends SIGUSR1 to every
            # rank when one exits: a rank still ending would die of it (exit 138) under on_actor_loss: continue
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def end_within(seconds: float) -> None:
    """From now on, this process ends after ``seconds`` at the latest, its Python stacks in ``logs/rank-N.stacks``.

    For the very end of a rank whose job has finished (its final report is
    sent): freeing the world communicator and ``MPI_Finalize`` wait for every
    rank of the world, also one that was lost and gone on without
    (``faults.on_actor_loss: continue``), and would never return. They wait
    inside MPI holding the GIL, so no Python thread could end the process:
    :func:`faulthandler.dump_traceback_later` does it from a C thread
    (``_exit(1)``; the launcher judges the run by its ledger.json).
    """
    faulthandler.dump_traceback_later(seconds, exit=True, file=_STACK_FILES[-1] if _STACK_FILES else sys.stderr)
