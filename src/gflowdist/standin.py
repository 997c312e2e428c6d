"""The process MPI_Comm_spawn starts in place of a lost actor (``faults.on_actor_loss: replace``).

``python -m gflowdist.standin``, started by the collector
(:class:`gflowdist.runtime.replacing.Replacer`), never by hand. This module
imports nothing heavy before MPI starts: ``MPI_Comm_spawn`` returns only once
the new process initialised MPI. In order:

1. a rank keeper forks first (:func:`gflowdist.cli.rank_keeper.keep`), as for
   every rank, so that a kill -9 of this process is an ordinary exit to hydra
   and ends nothing else;
2. MPI starts; the collector is at the other end of the parent
   intercommunicator; this process opens an MPI port, sends its name, and
   gets the rank it stands in for, the job's size, the layout, the run
   directory and its generation;
3. it accepts one connection per other peer of that rank (its trainer and
   buffer, :func:`gflowdist.runtime.replacing.adopt`), within
   ``faults.startup_timeout_s``, and reaches each peer through its own
   intercommunicator (:meth:`gflowdist.comm.mpi.MPIComm.standing_in`);
4. it reads the run's recorded config (``config.yaml``), plans the layout
   again (it must match the collector's), builds the actor role afresh,
   its run state and ledger from zero, and runs the actor loop
   (:func:`gflowdist.runtime.loops.run_actor`) until its trainer says stop;
5. its final checkpoint part and final report, like any actor's, then it
   ends without ``MPI_Finalize`` (the lost rank is still in the world).

A failure here is logged in ``logs/rank-N.log`` and said on stderr; the
collector then misses this process's heartbeats and names the rank lost.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import time
from typing import Any

__all__ = ["main", "HANDSHAKE_TAG", "STANDIN_VARIABLE"]

#: Set in a replacement's environment: which replacement of its rank it is (1, 2, ...). A role may read it.
STANDIN_VARIABLE = "GFLOWDIST_STANDIN"

#: The MPI tag of the raw handshake messages on a replacement's intercommunicators (before any channel uses them).
HANDSHAKE_TAG = 32000

log = logging.getLogger("gflowdist.runtime")


def main() -> None:
    """Stand in for a lost actor (see the module docstring); never returns."""
    from gflowdist.cli.rank_keeper import keep

    keep()
    from mpi4py import MPI

    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # hydra's notice that a process of the job died
    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        sys.stderr.write(f"{__name__}: started by MPI_Comm_spawn in place of a lost actor, never by hand\n")
        os._exit(2)
    port = MPI.Open_port()
    parent.send(port, dest=0, tag=HANDSHAKE_TAG)
    spec = parent.recv(source=0, tag=HANDSHAKE_TAG)
    rank = int(spec["rank"])
    code = 0
    try:
        routes = _accept_peers(MPI, port, spec, parent)
        _run(spec, routes)
    except BaseException as err:  # said once, then this process ends; the collector names the rank
        log.exception("the replacement of rank %d failed", rank)
        sys.stderr.write(f"gflowdist: the replacement of rank {rank} failed: {type(err).__name__}: {err}\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _accept_peers(MPI: Any, port: str, spec: dict, parent: Any) -> dict[int, Any]:
    """One intercommunicator per peer of my rank: the collector's (the parent) and one per peer that connects."""
    routes = {int(spec["collector"]): parent}
    faulthandler.dump_traceback_later(float(spec["startup_timeout_s"]), exit=True)  # a peer that never connects
    for _ in spec["peers"]:
        inter = MPI.COMM_SELF.Accept(port)
        routes[int(inter.recv(source=0, tag=HANDSHAKE_TAG))] = inter
    faulthandler.cancel_dump_traceback_later()
    MPI.Close_port(port)
    return routes


def _run(spec: dict, routes: dict[int, Any]) -> None:
    from pathlib import Path

    import torch

    from gflowdist.comm.mpi import MPIComm
    from gflowdist.context import DistributedContext
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
    role = make_role(ctx, config, generator, "cpu")
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
