"""Running one job on every rank: context, roles, loops, shutdown, ledger check, report.

:func:`run_job` is what ``gflowdist run`` calls inside a job (under mpiexec,
torchrun or our gloo spawner). On every rank it builds the
:class:`~gflowdist.context.DistributedContext`, instantiates the configured
role class, runs that role's loop, drains, checkpoints, and sends its final
report to the collector (the coordinator, else rank 0), which checks the
ledger and writes the run directory::

    runs/<name>-<timestamp>/
      config.yaml  layout.txt  metrics.jsonl  ledger.json  finals.json
      report.txt  report.json  report.png  [tensorboard/]  logs/rank-N.log  checkpoints/gen-K/

Any exception on any rank ends the whole job: the rank prints its traceback
(naming rank, role and host) and aborts the job (MPI ``Abort``; on the torch
engine the process exits and the launcher stops the others). A rank silent
for longer than ``faults.peer_timeout_s`` is reported by the collector as
lost, by rank, role and host, and the job aborts.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

import torch
from gflowdist.comm import world_comm
from gflowdist.context import COMM_NAMES, DistributedContext
from gflowdist.errors import GflowdistError, LedgerError, PeerLostError
from gflowdist.jobenv import FAILURE_FILE_VARIABLE
from gflowdist.layout import Role
from gflowdist.runtime import checkpoints, protocol, roles
from gflowdist.runtime.resume import choose_checkpoint
from gflowdist.rundir import agree_run_dir, write_config
from gflowdist.runtime.collector import Collector
from gflowdist.runtime.device_setup import setup_device
from gflowdist.runtime.ledger import Ledger, check_ledgers
from gflowdist.runtime.loops import run_actor, run_buffer, run_trainer, send_final
from gflowdist.runtime.wiring import StopFlag, Wiring

__all__ = ["run_job", "JobResult"]

log = logging.getLogger("gflowdist.runtime")

DEFAULT_CLASSES = {Role.TRAINER: roles.Trainer, Role.ACTOR: roles.Actor, Role.BUFFER: roles.BufferManager,
                   Role.COORDINATOR: roles.Coordinator}


class JobResult(dict):
    """What the collector returns: run_dir, totals of the ledger, last metrics."""


_STACK_FILES: list = []


def _ignore_peer_death_signal() -> None:
    """Ignore SIGUSR1, which MPICH's hydra sends every rank when one of them dies.

    With ``-disable-auto-cleanup`` (how ``gflowdist run`` starts MPICH) a
    rank's death makes hydra's proxy send SIGUSR1 to the other ranks. Its
    default action ends them silently, and with any handler installed (a
    faulthandler dump included) about one run in three still lost every
    survivor within 0.1 s, so nobody named the lost rank. Ignored, the
    survivors go on, miss the dead rank's heartbeats and report it
    (``tests/test_runtime_jobs.py::test_kill9_of_a_rank_ends_the_job_naming_it``).
    Stack dumps therefore use SIGUSR2.
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def _setup_logging(run_dir: Path, rank: int) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
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


def _make_role(ctx: DistributedContext, config, generator: torch.Generator, device: str = "cpu"):
    cls = config.role_class(ctx.role.value) or DEFAULT_CLASSES[ctx.role]
    if ctx.role in (Role.TRAINER, Role.ACTOR) and cls.rollout is roles.Actor.rollout:
        raise GflowdistError(f"roles.{ctx.role.value} is not set: a {ctx.role.value} needs your class with "
                             f"rollout() (see gflowdist.runtime.roles)")
    role = cls(rank=ctx.rank, config=config, generator=generator, context=ctx, device=device)
    role.setup()
    return role


def run_job(config, *, resume_dir: str | None = None, comm=None, out: TextIO = sys.stdout) -> JobResult | None:
    """Run ``config`` on this rank; returns the result on the collector rank, None elsewhere."""
    from gflowdist.ops.seeds import rank_seed

    placed = setup_device(config.launch.devices)  # before any CUDA work, and before nccl could start
    world = comm if comm is not None else world_comm(config.launch.engine, cuda=placed.cuda_index is not None)
    _ignore_peer_death_signal()  # after MPI_Init, which may install a handler of its own
    stop = StopFlag()
    stop.install_signal_handlers()
    ctx = DistributedContext.create(config.layout, comm=world)
    run_dir = agree_run_dir(world, config, resume_dir)
    w = Wiring.build(ctx, config, stop)
    is_collector = world.rank == w.collector
    if is_collector:
        run_dir.mkdir(parents=True, exist_ok=True)
    world.barrier(timeout=60)
    _setup_logging(run_dir, world.rank)
    log.info("rank %d role %s host %s pid %d device %s (%s)", world.rank, ctx.role.value, ctx.host, os.getpid(),
             placed.device, placed.reason)
    seed = rank_seed(config.run.seed, world.rank)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    try:
        return _run(ctx, config, w, run_dir, resume_dir, generator, out, placed.device)
    except PeerLostError as err:
        _die(world, f"gflowdist: {err}", code=3)
    except KeyboardInterrupt:
        _die(world, f"gflowdist: rank {world.rank} interrupted", code=130)
    except BaseException as err:  # noqa: BLE001 - any failure on any rank ends the whole job
        where = ctx.describe_rank(world.rank)
        _die(world, f"gflowdist: {where} failed: {type(err).__name__}: {err}\n{traceback.format_exc()}", code=1)
    finally:
        ctx.cleanup()
    return None


#: How long a failing rank lets its stderr line travel to the launcher before it aborts the job.
FORWARD_BEFORE_ABORT_S = 0.2


def _die(world, message: str, *, code: int) -> None:
    # The failure file first: if mpiexec is already gone, writing to stderr may fail.
    failure_file = os.environ.get(FAILURE_FILE_VARIABLE)
    if failure_file:
        with open(failure_file, "a") as f:
            f.write(message.rstrip() + "\n\0")
    log.error(message)
    try:
        sys.stderr.write(message.rstrip() + "\n")
        sys.stderr.flush()
    except OSError:  # nobody is reading our stderr any more
        pass
    if world.size > 1:
        # MPI's abort makes the launcher kill every rank at once; hydra's proxy may handle the abort
        # before it has read (and forwarded) the line above, and the launcher believes a failure
        # line it has seen come through mpiexec (a partition's far side cannot send one).
        time.sleep(FORWARD_BEFORE_ABORT_S)
        world.abort(code)
    raise SystemExit(code)


def _run(ctx, config, w: Wiring, run_dir: Path, resume_dir, generator, out, device: str) -> JobResult | None:
    world = ctx.world
    is_collector = world.rank == w.collector
    role = _make_role(ctx, config, generator, device)
    replay = role.make_buffer() if ctx.role is Role.BUFFER else None
    state: dict[str, Any] = {"step": 0, "version": 0, "seq": 0}
    resumed_from, skipped = None, []
    if resume_dir is not None:
        resumed_from, skipped = _resume(run_dir, world, role, replay, state, w, generator)

    def save_checkpoint(name: str) -> dict:
        payload = {"role": role.state_dict(),
                   "runtime": {k: v for k, v in state.items() if k not in ("staleness", "replay")},
                   "ledger": w.ledger.to_dict(), "torch_rng": torch.get_rng_state(),
                   "generator": generator.get_state()}
        if replay is not None:
            payload["replay"] = replay.state_dict()
        record = checkpoints.save_rank(run_dir, name, world.rank, payload)
        log.info("saved my part of checkpoint %s (%d bytes)", name, record["bytes"])
        return record

    w.save_checkpoint = save_checkpoint
    # Setup (models, optimizers, data) may take long: liveness clocks start once every rank is ready.
    world.barrier(timeout=config.faults.startup_timeout_s)
    w.reset_liveness()
    _keep_alive_while_waiting(ctx, w)
    metrics_file = None
    collector = None
    if is_collector:
        write_config(run_dir, config, world.size, world.engine)
        (run_dir / "layout.txt").write_text(ctx.layout.describe() + "\n")
        resumed_step = checkpoints.step_of(resumed_from) if resumed_from is not None else None
        if resumed_step is not None:
            dropped = checkpoints.trim_metrics(run_dir / "metrics.jsonl", resumed_step)
            if dropped:
                log.info("dropped %d metrics rows of steps >= %d: the interrupted run wrote them after "
                         "checkpoint %s, and this run repeats those steps", dropped, resumed_step, resumed_from)
        metrics_file = open(run_dir / "metrics.jsonl", "a", buffering=1)
        coordinator = role if ctx.role is Role.COORDINATOR else None
        collector = Collector(w, metrics_file=metrics_file, out=out, run_dir=run_dir,
                              on_metrics=coordinator.on_metrics if coordinator else None,
                              on_summary=coordinator.on_summary if coordinator else None,
                              extra_fields=coordinator.progress_fields if coordinator else None)
        w.on_saved_here = collector.note_saved
        out.write(f"gflowdist: {ctx.layout.summary()}\ngflowdist: run directory {run_dir}\n")
        _say_resumed(out, resumed_from, skipped)
    if ctx.role is Role.TRAINER:
        run_trainer(role, w, state, collector)
    elif ctx.role is Role.ACTOR:
        run_actor(role, w, state)
    elif ctx.role is Role.BUFFER:
        state["replay"] = replay
        run_buffer(role, w, state)
        state.pop("replay")
    else:
        _coordinate(role, w, collector)
    final_name = checkpoints.checkpoint_name(w.generation)
    checkpoint_file = save_checkpoint(final_name)
    staleness = {str(k): v for k, v in state.get("staleness", Counter()).items()}
    extra = {"staleness": staleness, "step": state.get("step", 0), "summary": role.summary(), "pid": os.getpid(),
             "checkpoint_file": checkpoint_file}
    if replay is not None:
        extra["replay"] = replay.stats()
    final = send_final(w, ctx.role.value, extra)
    if not is_collector:
        log.info("finished: %s", json.dumps(w.ledger.to_dict()))
        return None
    finals = collector.wait_finals()
    final["ledger"] = w.ledger.to_dict()  # with what the collector refused while it waited
    finals[world.rank] = final
    collector.progress(force=True)
    collector.finish_line()
    metrics_file.close()
    return _conclude(ctx, config, run_dir, final_name, finals, collector, stop_reason=w.stop.reason, out=out)


def _resume(run_dir: Path, world, role, replay, state: dict, w: Wiring, generator) -> tuple[str, list[str]]:
    """Load this rank's part of the newest complete, intact checkpoint of ``run_dir``.

    Returns its name and the newer checkpoints skipped as damaged (each naming the file and what is wrong).
    """
    chosen = choose_checkpoint(run_dir, world)
    saved = chosen.payload
    role.load_state_dict(saved["role"])
    state.update(saved["runtime"])
    w.ledger = Ledger.from_dict(saved["ledger"])
    torch.set_rng_state(saved["torch_rng"])
    generator.set_state(saved["generator"])
    if replay is not None and "replay" in saved:
        replay.load_state_dict(saved["replay"])
    w.generation = chosen.manifest["generation"] + 1
    for reason in chosen.skipped:
        log.warning("%s", reason)
    log.info("resumed from checkpoint %s at step %s", chosen.name, state.get("step"))
    return chosen.name, chosen.skipped


def _say_resumed(out: TextIO, resumed_from: str | None, skipped: list[str]) -> None:
    for reason in skipped:
        out.write(f"gflowdist: {reason}\n")
    if resumed_from is not None:
        newest = " (the newest complete, intact one)" if skipped else ""
        out.write(f"gflowdist: resuming from checkpoint {resumed_from}{newest}\n")
    out.flush()


def _keep_alive_while_waiting(ctx: DistributedContext, w: Wiring) -> None:
    """While a collective waits (e.g. on a dead agent-group peer), keep heartbeating and listening.

    Without this a rank blocked on a dead peer falls silent too, and could be
    reported as the lost one.
    """
    def hook() -> None:
        w.heartbeat(-1)
        w.check_control()

    for name in COMM_NAMES:
        comm = ctx.comm(name)
        if comm is not None:
            comm.wait_hook = hook


def _coordinate(coordinator, w: Wiring, collector: Collector) -> None:
    """The coordinator's loop: listen, print progress, decide to stop, until every rank reported."""
    from gflowdist.comm.polling import Backoff

    layout = w.context.layout
    stop_sent = False
    backoff = Backoff(spin_s=0.0, first_sleep_s=0.001, max_sleep_s=0.02)
    while len(collector.finals) < len(collector.others):
        got = collector.poll()
        if not stop_sent and (w.stop or coordinator.should_stop()):
            reason = w.stop.reason or "the coordinator decided to stop"
            for rank in layout.trainers + layout.actors:
                w.control.isend(*protocol.stop(reason), rank)
            stop_sent = True
        collector.progress()
        if got:
            backoff.reset()
        else:
            backoff.pause()


def _curves_by_step(rows: list[dict]) -> list[dict]:
    """One row per step: each metric averaged over the trainers that reported it (rank/time dropped)."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        values = by_step.setdefault(int(row.get("step", 0)), {})
        for key, value in row.items():
            if key not in ("rank", "time", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                values.setdefault(key, []).append(float(value))
    return [{"step": step, **{k: sum(v) / len(v) for k, v in values.items()}}
            for step, values in sorted(by_step.items())]


def _write_tensorboard(run_dir: Path, out: TextIO) -> None:
    """``run.tensorboard``: event files from what the run directory now holds (metrics.jsonl is the source)."""
    from gflowdist.timing.tensorboard import write_tensorboard

    try:
        folder = write_tensorboard(run_dir)
    except (ImportError, OSError, GflowdistError) as err:  # the run itself is done: say so, keep its result
        log.warning("TensorBoard files not written: %s", err)
        out.write(f"gflowdist: TensorBoard files not written: {err}\n")
        return
    out.write(f"gflowdist: TensorBoard event files in {folder} (tensorboard --logdir {folder})\n")


def _conclude(ctx, config, run_dir: Path, final_name: str, finals: dict[int, dict], collector: Collector,
              *, stop_reason: str, out: TextIO) -> JobResult:
    from gflowdist.timing import build_report

    layout = ctx.layout
    checkpoints.write_manifest(run_dir, final_name, {
        "world_size": layout.world_size, "generation": collector.w.generation, "complete": True,
        "steps": {str(r): f.get("step", 0) for r, f in finals.items()}},
        files={r: f["checkpoint_file"] for r, f in finals.items()})
    (run_dir / "finals.json").write_text(json.dumps({str(r): finals[r] for r in sorted(finals)}, indent=1))
    ledgers = {r: Ledger.from_dict(f["ledger"]) for r, f in finals.items()}
    metrics_rows = []
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.exists():
        metrics_rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    report = build_report(
        {r: f["timing"] for r, f in finals.items()},
        roles={r: f["role"] for r, f in finals.items()},
        hosts={r: f["host"] for r, f in finals.items()},
        ledger={r: {"produced": l.produced, "sent": l.sent, "received": l.received, "admitted": l.admitted,
                    "dropped": dict(l.dropped), "in_flight": l.in_flight} for r, l in ledgers.items()},
        staleness={r: f["staleness"] for r, f in finals.items() if f.get("staleness")},
        metrics=_curves_by_step(metrics_rows))
    report.save(run_dir)
    if config.run.tensorboard:
        _write_tensorboard(run_dir, out)
    per_rank = {str(r): l.to_dict() for r, l in ledgers.items()}
    try:
        totals = check_ledgers(ledgers)
    except LedgerError as err:
        line = f"gflowdist: FAILED: {err}; run directory {run_dir}"
        (run_dir / "ledger.json").write_text(json.dumps({"balanced": False, "error": str(err), "final_line": line,
                                                         "per_rank": per_rank}, indent=1))
        raise
    malformed = totals["malformed_messages"]
    line = (f"gflowdist: done{' (' + stop_reason + ')' if stop_reason else ''}: "
            f"{totals['produced']} trajectories produced, {totals['admitted']} admitted, "
            f"{totals['dropped']} dropped, ledger balanced"
            f"{f'; {malformed} malformed messages rejected' if malformed else ''}; run directory {run_dir}")
    (run_dir / "ledger.json").write_text(json.dumps({"balanced": True, "totals": totals, "final_line": line,
                                                     "per_rank": per_rank}, indent=1))
    out.write(report.to_text() + "\n")
    last = {r: m for r, m in collector.latest.items()}
    out.write(line + "\n")
    out.flush()
    return JobResult(run_dir=str(run_dir), totals=totals, last_metrics=last, checkpoint=final_name,
                     summaries={r: f.get("summary", {}) for r, f in finals.items()})
