"""A spare actor: the process MPI_Comm_spawn starts to stand in for a lost actor (``faults.on_actor_loss: replace``).

``python -m gflowdist.standin HOST:PID,... COLLECTOR HEARTBEAT_S``, started at the job's start-up by
every rank but the actors together (:func:`gflowdist.runtime.spares.start_spares`),
never by hand. This module imports nothing heavy before MPI starts:
``MPI_Comm_spawn`` returns only once the new process initialised MPI. In order:

1. a rank keeper forks first (:func:`gflowdist.cli.rank_keeper.keep`), as for
   every rank, so that a kill -9 of this process is an ordinary exit to hydra
   and ends nothing else;
2. MPI starts; the ranks that spawned it are the remote group of the parent
   intercommunicator; it imports what an actor needs (torch, the runtime)
   and waits, without a deadline but ending with the processes that spawned
   it (``HOST:PID,...``, those on this host), for the collector's word, and
   sends the collector a heartbeat every ``faults.heartbeat_s`` meanwhile
   (:class:`Beats`; one that falls silent is named and never called):
   ``None`` (the run is over: it ends once they have), or the rank it stands in for, the
   job's size, the layout, the run directory, its generation, and which
   world rank each member of that group is;
3. it reaches each of them through that intercommunicator
   (:meth:`gflowdist.comm.mpi.MPIComm.standing_in`);
4. it reads the run's recorded config (``config.yaml``), plans the layout
   again (it must match the collector's), takes the lost rank's device
   (``launch.devices``: :func:`gflowdist.devices.replacement_device`), builds the actor role afresh,
   its run state and ledger from zero, and runs the actor loop
   (:func:`gflowdist.runtime.loops.run_actor`) until its trainer says stop;
5. its final checkpoint part and final report, like any actor's, then it
   ends without ``MPI_Finalize`` (the lost rank is still in the world).

A failure here is logged in ``logs/rank-N.log`` and said on stderr; the
collector then misses this process's heartbeats and names the rank lost.

For tests of those faults, :data:`FAULT_VARIABLE` makes this process end at
the worst moments: ``before-mpi`` (after its rank keeper, before MPI starts:
the start-up spawn never returns, and each spawning rank ends after
``faults.startup_timeout_s``, naming it), ``idle`` (1 s into its wait, after
its first heartbeats: the collector names it within ``faults.peer_timeout_s``
and never calls it) or ``on-call`` (once the collector made it a rank and
told its trainer and buffer so).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from typing import Any

from gflowdist.process_tree import is_running

__all__ = ["main", "HANDSHAKE_TAG", "SPARE_BEAT_TAG", "STANDIN_VARIABLE", "FAULT_VARIABLE"]

#: Set in a replacement's environment: which replacement of its rank it is (1, 2, ...). A role may read it.
STANDIN_VARIABLE = "GFLOWDIST_STANDIN"

#: A test hook: ``before-mpi`` or ``on-call`` ends the spare there, exit status 3 (module docstring).
FAULT_VARIABLE = "GFLOWDIST_STANDIN_FAULT"

#: How long a spare that was not needed waits for the ranks on its host to end, at most.
SPARE_END_S = 60.0

#: The MPI tag of the raw handshake messages on a replacement's intercommunicators (before any channel uses them).
HANDSHAKE_TAG = 32000

#: The MPI tag of an idle spare's heartbeats to the collector (8 raw bytes on a duplicate of the intercommunicator).
SPARE_BEAT_TAG = 32001

log = logging.getLogger("gflowdist.runtime")


def main() -> None:
    """Wait as a spare actor, then stand in for a lost one (see the module docstring); never returns."""
    from gflowdist.cli.rank_keeper import keep

    keep(close_pmi=True)
    fault = os.environ.get(FAULT_VARIABLE, "")
    if fault == "before-mpi":
        os._exit(3)
    from mpi4py import MPI

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice that a process of the job died
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL or len(sys.argv) < 4:
        sys.stderr.write(f"{__name__}: started by MPI_Comm_spawn as a spare actor, never by hand\n")
        os._exit(2)
    beats = parent.Dup()  # collective with the ranks that spawned me (gflowdist.runtime.spares.start_spares)
    _warm_up()
    spec = _wait_for_call(MPI, parent, sys.argv[1], Beats(MPI, beats, int(sys.argv[2]), float(sys.argv[3])))
    if spec is None:  # the run is over, and no actor was lost
        os._exit(0)
    if fault == "on-call":
        os._exit(3)
    rank = int(spec["rank"])
    code = 0
    try:
        routes = {int(member): (parent, index) for index, member in enumerate(spec["members"])}
        _run(spec, routes)
    except BaseException as err:  # said once, then this process ends; the collector names the rank
        log.exception("the replacement of rank %d failed", rank)
        sys.stderr.write(f"gflowdist: the replacement of rank {rank} failed: {type(err).__name__}: {err}\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _warm_up() -> None:
    """Import what an actor runs on now, while nothing waits for this process (torch's first import is slow)."""
    import torch  # noqa: F401

    import gflowdist.runtime.job
    import gflowdist.runtime.loops  # noqa: F401


class Beats:
    """An idle spare's heartbeats: 8 bytes to the collector every ``faults.heartbeat_s``, on their own duplicate of
    the intercommunicator; never more than one on its way (a collector that stopped listening costs nothing)."""

    def __init__(self, MPI: Any, comm: Any, collector: int, every_s: float):
        self.MPI, self.comm, self.collector, self.every_s = MPI, comm, collector, every_s
        self.payload = bytearray(os.getpid().to_bytes(8, "little"))
        self.request: Any = None
        self.last = 0.0

    def beat(self) -> None:
        """Send one when it is due and the one before has left."""
        now = time.monotonic()
        if now - self.last < self.every_s or (self.request is not None and not self.request.Test()):
            return
        self.request = self.comm.Isend([self.payload, self.MPI.BYTE], self.collector, SPARE_BEAT_TAG)
        self.last = now


def _wait_for_call(MPI: Any, parent: Any, watch: str, beats: Beats) -> dict | None:
    """The collector's word (see the module docstring), sending my heartbeats meanwhile. Ends this process once
    the processes that spawned it (``HOST:PID,...``; those on this host) have ended, or after the collector's None,
    once they have or :data:`SPARE_END_S` passed (an exit while they still end could break their MPI_Finalize)."""
    here = socket.gethostname()
    pids = [int(pid) for host, _, pid in (item.rpartition(":") for item in watch.split(",")) if host == here]
    request = parent.irecv(source=MPI.ANY_SOURCE, tag=HANDSHAKE_TAG)
    fault_at = time.monotonic() + 1.0 if os.environ.get(FAULT_VARIABLE) == "idle" else None
    while True:
        done, spec = request.test()
        if done and spec is not None:
            return spec
        if done or (pids and not any(is_running(pid) for pid in pids)):
            break
        if fault_at is not None and time.monotonic() > fault_at:
            os._exit(3)
        beats.beat()
        time.sleep(min(0.05, beats.every_s / 2))
    deadline = time.monotonic() + SPARE_END_S
    while time.monotonic() < deadline and any(is_running(pid) for pid in pids):
        time.sleep(0.05)
    return None


def _run(spec: dict, routes: dict[int, tuple[Any, int]]) -> None:
    from pathlib import Path

    import torch

    from gflowdist.comm.mpi import MPIComm
    from gflowdist.context import DistributedContext
    from gflowdist.devices import replacement_device
    from gflowdist.errors import LayoutError
    from gflowdist.layout.planning import plan_layout
    from gflowdist.ops.seeds import rank_seed, seed_all
    from gflowdist.rundir import recorded_config
    from gflowdist.runtime import checkpoints
    from gflowdist.runtime.checkpoints import CheckpointSaver
    from gflowdist.runtime.job import make_role
    from gflowdist.runtime.ledger import Ledger
    from gflowdist.runtime.loops import run_actor
    from gflowdist.runtime.process import _setup_logging, print_whole_lines
    from gflowdist.runtime.roles import Actor
    from gflowdist.runtime.state import ActorState
    from gflowdist.runtime.wiring import StopFlag, Wiring

    print_whole_lines()
    rank, size, run_dir = int(spec["rank"]), int(spec["size"]), Path(spec["run_dir"])
    config = recorded_config(run_dir)
    _setup_logging(run_dir, rank)
    comm = MPIComm.standing_in(rank, size, routes)
    layout = plan_layout(size, config.layout, spec["hosts"])
    if layout.to_dict() != spec["layout"]:
        raise LayoutError(f"the layout planned for rank {rank}'s replacement differs from the collector's")
    none: dict[str, Any] = {"trainers": None, "DP": None, "POP": None, "buffers": None}
    ctx = DistributedContext(comm, layout, {"world": comm, **none})
    stop = StopFlag()
    stop.install_signal_handlers()
    incarnation = int(spec["incarnation"])
    os.environ[STANDIN_VARIABLE] = str(incarnation)
    seed = rank_seed(config.run.seed, rank * 1_000_003 + incarnation)  # not the lost actor's stream again
    seed_all(seed)
    generator = torch.Generator().manual_seed(seed)
    log.info(
        "rank %d: a replacement (number %d) in pid %d, started with MPI_Comm_spawn", rank, incarnation, os.getpid()
    )
    placed = replacement_device(config.launch.devices, rank, spec.get("device"), _visible_gpus(torch))
    if placed.cuda_index is not None:
        torch.cuda.set_device(placed.cuda_index)
    log.info("rank %d: the replacement computes on %s (%s)", rank, placed.device, placed.reason)
    role = make_role(ctx, config, generator, placed.device)
    if not isinstance(role, Actor):
        raise TypeError(f"roles.actor made a {type(role).__name__}, not an Actor")
    state, ledger = ActorState(), Ledger()
    saver = CheckpointSaver(run_dir, rank, role, state, ledger, generator, None)
    w = Wiring.build(ctx, config, stop, ledger=ledger, saver=saver, generation=int(spec["generation"]))
    w.liveness.reset()
    w.liveness.heartbeat(-1)  # the collector: this replacement runs
    run_actor(role, w, state)
    file = w.reports.save_part(checkpoints.checkpoint_name(w.generation))
    extra = {"staleness": {}, "step": 0, "summary": role.summary(), "pid": os.getpid(), "checkpoint_file": file}
    w.reports.send_final("actor", {**extra, "incarnation": incarnation})
    _linger(w)


def _visible_gpus(torch: Any) -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _linger(w: Any) -> None:
    """Until the collector falls silent (the run is over), at most ``faults.peer_timeout_s``: an exit now would
    make hydra tell every rank a process died while they still stop their actors."""
    heard, deadline = time.monotonic(), time.monotonic() + w.settings.peer_timeout_s
    quiet = 3 * w.settings.heartbeat_s
    while time.monotonic() < deadline and time.monotonic() - heard < quiet:
        if w.control.try_recv(w.collector) is not None:
            heard = time.monotonic()
        time.sleep(0.01)


if __name__ == "__main__":
    main()
