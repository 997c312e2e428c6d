"""Running one job on every rank: the rank's process, its role, its loop, the end of the run.

:func:`run_job` is what ``gflowdist run`` calls inside a job (under mpiexec,
torchrun or our gloo spawner). On every rank, in order:

1. :func:`~gflowdist.runtime.process.prepare_rank`: device, signals, the
   :class:`~gflowdist.context.DistributedContext`, the run directory, logs, seeds;
2. :func:`make_role`: the configured role class, its ``setup()``; a buffer's
   replay buffer; the role's run state (:mod:`gflowdist.runtime.state`), restored
   from the newest complete, intact checkpoint with ``--resume``
   (:mod:`gflowdist.runtime.resume`);
3. the :class:`~gflowdist.runtime.wiring.Wiring`, built complete (ledger,
   generation, checkpoint saver); a start-up barrier; on the collector (the
   coordinator, else rank 0) the :class:`~gflowdist.runtime.collector.Collector`,
   hosted by the wiring's reports (:mod:`gflowdist.runtime.reporting`);
4. the role's loop (:mod:`gflowdist.runtime.loops`);
5. the final checkpoint and the final report to the collector, which checks
   the ledger and writes the run directory (:mod:`gflowdist.runtime.conclusion`)::

    runs/<name>-<timestamp>/
      config.yaml  layout.txt  metrics.jsonl  ledger.json  finals.json
      report.txt  report.json  report.png  [tensorboard/]  logs/rank-N.log  checkpoints/gen-K/

Any exception on any rank ends the whole job: the rank says why once, in the
user's terms (:mod:`gflowdist.runtime.failures`: rank, role, host, step, the
user's frames, its log), the collector gathers what every rank holds into a
partial report and trace (:mod:`gflowdist.runtime.postmortem`), and the job
aborts (MPI ``Abort``; on the torch engine the process exits and the launcher
stops the others). A rank silent for longer than ``faults.peer_timeout_s`` is
reported by the collector as lost, by rank, role and host, with the same
post-mortem.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import torch

from gflowdist.comm import Communicator
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.errors import GflowdistError, ReplayDivergence
from gflowdist.layout import Role
from gflowdist.replay import ReplayBuffer
from gflowdist.rundir import write_config
from gflowdist.runtime import checkpoints, roles
from gflowdist.runtime.checkpoints import CheckpointSaver
from gflowdist.runtime.collector import Collector
from gflowdist.runtime.conclusion import JobResult, conclude
from gflowdist.runtime.device_record import device_notes, write_devices
from gflowdist.runtime.generations import generation_note, restart_record
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.loops import run_actor, run_buffer, run_coordinator, run_trainer
from gflowdist.runtime.loops.inference import InferenceStats, run_inference
from gflowdist.runtime.observing import measure_clock_offset, open_tape, open_trace
from gflowdist.runtime.postmortem import Holding, end_failed
from gflowdist.runtime.process import RankProcess, end_of_process_bounded, fail_job, prepare_rank
from gflowdist.runtime.progress import producer_class
from gflowdist.runtime.resume import restore
from gflowdist.runtime.spares import start_spares
from gflowdist.runtime.state import ActorState, BufferState, RunState, TrainerState, state_for
from gflowdist.runtime.wiring import Wiring

__all__ = ["run_job", "JobResult", "make_role", "Rank"]

log = logging.getLogger("gflowdist.runtime")

DEFAULT_CLASSES = {
    Role.TRAINER: roles.Trainer,
    Role.ACTOR: roles.Actor,
    Role.INFERENCE: roles.Actor,  # an inference rank runs the actor class's policy (roles.actor)
    Role.BUFFER: roles.BufferManager,
    Role.COORDINATOR: roles.Coordinator,
}


def run_job(
    config: Config, *, resume_dir: str | None = None, comm: Communicator | None = None, out: TextIO = sys.stdout
) -> JobResult | None:
    """Run ``config`` on this rank; returns the result on the collector rank, None elsewhere."""
    process = prepare_rank(config, resume_dir, comm)
    world, ctx = process.world, process.context
    try:
        return _run(process, config, resume_dir, out)
    except ReplayDivergence as err:
        fail_job(world, f"gflowdist: {err}", code=4)
    except BaseException as err:  # the post-mortem, then the end of the job (runtime.postmortem)
        end_failed(process, process.holding, err)
    finally:
        end_of_process_bounded(
            world, process.deaths
        )  # freeing communicators and MPI_Finalize would wait for a lost rank
        ctx.cleanup()
    return None


@dataclass
class Rank:
    """This rank's part of the job: its role object, run state, replay buffer (buffers) and wiring."""

    role: roles.BaseRole
    state: RunState
    replay: ReplayBuffer | None
    w: Wiring
    resumed_from: str | None
    resumed_step: int | None  # the step of the checkpoint resumed from (its manifest's)
    skipped: list[str]  # newer checkpoints not resumed from, each naming the file and what is wrong
    inference: InferenceStats | None = None  # an inference rank's batches and queueing delays
    loop_cpu_s: float | None = None  # the CPU seconds my role's loop used (its thread's)


def _run(process: RankProcess, config: Config, resume_dir: str | None, out: TextIO) -> JobResult | None:
    if process.watch is not None:  # until the heartbeats start: a peer dying in its setup is named at once
        process.watch.install(process.world)
    rank = _make_rank(process, config, resume_dir)
    world, w = process.world, rank.w
    if isinstance(rank.state, TrainerState):
        trainer_state = rank.state
        process.step = lambda: trainer_state.step
    w.liveness.spares = start_spares(w)  # faults.on_actor_loss: replace (every rank but the actors, together)
    # Setup (models, optimizers, data) may take long: liveness clocks start once every rank is ready.
    world.barrier(timeout=w.settings.startup_timeout_s)
    if w.settings.trace:
        w.reports.measured_offset(measure_clock_offset(world, process.context, w.collector, w.settings.peer_timeout_s))
    w.liveness.reset()
    w.liveness.heartbeat(-1)  # at once: the collector counts this generation's rate from the counts it carries
    w.liveness.heartbeat_while_waiting()
    collector = _open_collector(process, config, rank, out) if world.rank == w.collector else None
    if collector is not None:
        w.reports.host(collector)  # this rank's reports and its loop's turns go to the collector it hosts
        w.liveness.say = collector.line.say  # the collector's console: an expired notice of a death is said there
    # from here on a failure leaves a post-mortem (every rank is past setup: the collector can gather)
    process.holding = Holding(w, lambda: _final_extras(rank, {}), collector)
    if collector is not None and not (w.tape.recording or w.tape.replaying):
        w.liveness.poll_while_waiting(collector.poll)  # a recorded run takes messages where it recorded them
    try:
        return _run_to_end(process, config, rank, collector, out)
    finally:
        w.tape.close()  # a recording keeps what it holds, also when the run fails
        if collector is not None:
            collector.reach.flush()  # how far this generation got, for the next one's "steps repeated"
            if collector.board is not None:
                collector.board.close()  # a failed run keeps the scalars it had


def _run_to_end(
    process: RankProcess, config: Config, rank: Rank, collector: Collector | None, out: TextIO
) -> JobResult | None:
    """The role's loop, the final checkpoint and report; on the collector, the run's end."""
    w = rank.w
    cpu = time.thread_time()  # this thread's: a rank of the local engine is a thread of one process
    _run_loop(process.context.role, rank, collector)
    rank.loop_cpu_s = time.thread_time() - cpu
    final_name = checkpoints.checkpoint_name(w.generation)
    checkpoint_file = w.reports.save_part(
        final_name
    )  # and its instant on my trace, before the trace leaves with my report
    final = w.reports.send_final(process.context.role.value, _final_extras(rank, checkpoint_file))
    if collector is None:
        w.tape.finish()  # a replay checks that it made every recorded choice
        log.info("finished: %s", json.dumps(w.ledger.to_dict()))
        return None
    return _conclude(process, config, rank, collector, final_name, final, out)


def make_role(
    ctx: DistributedContext, config: Config, generator: torch.Generator, device: str = "cpu"
) -> roles.BaseRole:
    """The configured class of this rank's role (``roles.<role>``), instantiated and ``setup()``; an inference
    rank's is the actor class (``roles.actor``), whose ``act`` it runs."""
    key = Role.ACTOR.value if ctx.role is Role.INFERENCE else ctx.role.value
    cls = config.role_class(key) or DEFAULT_CLASSES[ctx.role]
    if inspect.isabstract(cls):
        missing = " and ".join(f"{name}()" for name in sorted(getattr(cls, "__abstractmethods__", ())))
        if cls is DEFAULT_CLASSES[ctx.role]:
            raise GflowdistError(
                f"roles.{key} is not set: a {ctx.role.value} needs your class with "
                f"{missing} (see gflowdist.runtime.roles)"
            )
        raise GflowdistError(
            f"roles.{key}: {cls.__module__}.{cls.__qualname__} does not implement "
            f"{missing}, which every {key} needs (see gflowdist.runtime.roles)"
        )
    role: roles.BaseRole = cls(rank=ctx.rank, config=config, generator=generator, context=ctx, device=device)
    role.setup()
    return role


def _make_rank(process: RankProcess, config: Config, resume_dir: str | None) -> Rank:
    """Role, state, replay buffer, restored from the newest checkpoint with ``--resume``, and the wiring."""
    ctx, world = process.context, process.world
    role = make_role(ctx, config, process.generator, process.device)
    replay = role.make_buffer() if isinstance(role, roles.BufferManager) else None
    state = state_for(ctx.role)
    restored = restore(process.run_dir, world, role, state, process.generator, replay) if resume_dir else None
    ledger = restored.ledger if restored is not None else Ledger()
    saver = CheckpointSaver(process.run_dir, world.rank, role, state, ledger, process.generator, replay)
    w = Wiring.build(
        ctx,
        config,
        process.stop,
        ledger=ledger,
        saver=saver,
        generation=restored.generation if restored is not None else 0,
        tape=open_tape(config, process.run_dir, ctx),
        deaths=process.deaths,
        trace=open_trace(config),
    )
    if restored is None:
        return Rank(role, state, replay, w, None, None, [])
    return Rank(role, state, replay, w, restored.name, restored.step, restored.skipped)


def _open_collector(process: RankProcess, config: Config, rank: Rank, out: TextIO) -> Collector:
    """The collector's run files (config.yaml, layout.txt, metrics.jsonl) and its :class:`Collector`."""
    run_dir, layout, world = process.run_dir, process.context.layout, process.world
    write_config(run_dir, config, world.size, world.engine)
    (run_dir / "layout.txt").write_text(layout.describe() + "\n")
    write_devices(run_dir, process.context)  # devices.json: every rank's device, how each agent group averages
    # rows of the steps this run repeats, written after the checkpoint by a generation that failed (a final
    # checkpoint's step is its furthest rank's: no row of the generation that wrote it is dropped)
    cut = rank.resumed_step if rank.resumed_from is not None else None
    if cut is not None:
        dropped = checkpoints.trim_metrics(run_dir / "metrics.jsonl", cut)
        if dropped:
            log.info(
                "dropped %d metrics rows of steps >= %d: the interrupted run wrote them after "
                "checkpoint %s, and this run repeats those steps",
                dropped,
                cut,
                rank.resumed_from,
            )
    metrics_file = open(run_dir / "metrics.jsonl", "a", buffering=1)
    coordinator = rank.role if isinstance(rank.role, roles.Coordinator) else None
    collector = Collector(
        rank.w,
        metrics_file=metrics_file,
        out=out,
        run_dir=run_dir,
        on_metrics=coordinator.on_metrics if coordinator else None,
        on_summary=coordinator.on_summary if coordinator else None,
        extra_fields=coordinator.progress_fields if coordinator else None,
        on_weights=coordinator.on_weights if coordinator else None,
        start_step=rank.resumed_step if rank.resumed_from is not None and rank.resumed_step is not None else 0,
        producer=producer_class(config, layout),
    )
    if config.run.tensorboard:
        from gflowdist.timing.tensorboard_live import LiveBoard

        collector.board = LiveBoard(run_dir)  # scalars as they arrive: tensorboard --logdir follows the run
    if coordinator is not None:
        coordinator.metrics_sink = lambda step, metrics: collector.record_metrics(
            rank.w.rank, {"step": step, **metrics}, tell_coordinator=False
        )
    out.write(f"gflowdist: {layout.summary()}\ngflowdist: run directory {run_dir}\n")
    _say_resumed(out, rank.resumed_from, rank.skipped)
    collector.generation_note = generation_note(
        rank.w.generation, restart_record(), rank.resumed_from, rank.resumed_step, collector.reach.before
    )
    if collector.generation_note:
        out.write(f"gflowdist: {collector.generation_note}\n")
        log.info("%s", collector.generation_note)
    return collector


def _say_resumed(out: TextIO, resumed_from: str | None, skipped: list[str]) -> None:
    for reason in skipped:
        out.write(f"gflowdist: {reason}\n")
    if resumed_from is not None:
        newest = " (the newest complete, intact one)" if skipped else ""
        out.write(f"gflowdist: resuming from checkpoint {resumed_from}{newest}\n")
    out.flush()


def _run_loop(role: Role, rank: Rank, collector: Collector | None) -> None:
    """This rank's loop (:mod:`gflowdist.runtime.loops`), until its role's end of the run."""
    user, state, w = rank.role, rank.state, rank.w  # the classes roles.<role> names subclass the role's base
    if role is Role.TRAINER and isinstance(user, roles.Trainer) and isinstance(state, TrainerState):
        run_trainer(user, w, state)
    elif role is Role.ACTOR and isinstance(user, roles.Actor) and isinstance(state, ActorState):
        run_actor(user, w, state)
    elif role is Role.BUFFER and isinstance(user, roles.BufferManager) and isinstance(state, BufferState):
        if rank.replay is None:
            raise GflowdistError(f"buffer rank {w.rank}: {type(user).__name__}.make_buffer() made no replay buffer")
        run_buffer(user, w, state, rank.replay)
    elif role is Role.INFERENCE and isinstance(user, roles.Actor) and isinstance(state, ActorState):
        rank.inference = run_inference(user, w, state)
    elif role is Role.COORDINATOR and isinstance(user, roles.Coordinator) and collector is not None:
        run_coordinator(user, w, collector)
    else:
        raise GflowdistError(f"rank {w.rank}: a {type(user).__name__} with a {type(state).__name__} is no {role.value}")


def _final_extras(rank: Rank, checkpoint_file: dict[str, Any]) -> dict[str, Any]:
    """What my final report carries besides ledger and timers: staleness, steps, summary, pid, the CPU seconds
    my role's loop used, on its thread (``loop_cpu_s``; absent when it did not finish it), my final checkpoint
    file's size and digest, replay stats."""
    trainer = rank.state if isinstance(rank.state, TrainerState) else None
    extra = {
        "staleness": {str(k): v for k, v in trainer.staleness.items()} if trainer else {},
        "step": trainer.step if trainer else 0,
        "summary": rank.role.summary(),
        "pid": os.getpid(),
        "checkpoint_file": checkpoint_file,
    }
    if rank.loop_cpu_s is not None:
        extra["loop_cpu_s"] = rank.loop_cpu_s
    if rank.replay is not None:
        extra["replay"] = rank.replay.stats()
    if rank.inference is not None:
        extra["inference"] = rank.inference.to_dict()
    return extra


def _conclude(
    process: RankProcess,
    config: Config,
    rank: Rank,
    collector: Collector,
    final_name: str,
    final: dict[str, Any],
    out: TextIO,
) -> JobResult:
    """On the collector: every rank's final report, the progress line's last word, the run's end."""
    finals = collector.wait_finals()
    rank.w.tape.finish()  # the final reports were my last recorded choices
    final["ledger"] = rank.w.ledger.to_dict()  # with what the collector refused while it waited
    finals[process.world.rank] = final
    for lost in sorted(rank.w.lost):  # actors the run went on without: their finals from what is known
        finals[lost] = collector.lost_actors.final_of(lost, finals)
        finals[lost]["checkpoint_file"] = checkpoints.save_rank(
            process.run_dir, final_name, lost, collector.lost_slot(lost, finals)
        )
    # the ledgers of actors lost and replaced (faults.on_actor_loss: replace)
    collector.replacer.merge(finals, collector.lost_actors.beats)
    collector.replacer.release()  # the spare actors no lost actor needed end
    collector.progress(force=True)
    collector.finish_line()
    if collector.metrics_file is not None:
        collector.metrics_file.close()
    if collector.board is not None:
        collector.board.close()  # the run's end writes every event file again, from the run directory
    return conclude(
        process.run_dir,
        final_name,
        finals,
        world_size=process.world.size,
        generation=rank.w.generation,
        last_metrics=collector.latest,
        stop_reason=rank.w.stop.reason,
        tensorboard=config.run.tensorboard,
        out=out,
        notes=[*([collector.generation_note] if collector.generation_note else []), *device_notes(process.context)],
        facts=collector.facts(),
    )
