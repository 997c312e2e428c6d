"""A failed run's post-mortem: what every rank held, gathered by the collector into the run directory.

Every rank keeps its timers, its trace (``run.trace``), its ledger and, on the
collector, every rank's last metrics, as it runs. When something ends the run
(an exception in the user's code, a batch refused under ``faults.on_bad_batch:
fail``, a lost peer, Ctrl-C seen as ``KeyboardInterrupt``), :func:`end_failed`
runs on the rank that saw it:

1. the failure is put in the user's terms (:mod:`gflowdist.runtime.failures`)
   and announced once: the failure file, the rank's log, the marked line for
   the launcher's relay (:func:`~gflowdist.runtime.process.announce_failure`);
2. a rank that is not the collector sends the collector a ``failed`` message
   with what it holds (:func:`held`), then waits for the collector to end the
   job (at most :func:`wait_s` plus a margin, then it ends the job itself);
3. the collector (hearing ``failed``, or failing itself, or losing a peer)
   asks every other live rank for what it holds (``postmortem``); each answers
   with a ``partial`` message and stops. What the collector has after
   :func:`wait_s` seconds, with what lost ranks last sent (their last metrics
   and heartbeat), is written by :func:`gflowdist.runtime.conclusion.conclude_failed`:
   ``failure.json``, ``report.txt``/``report.json``/``report.png`` and
   ``trace.json`` marked partial with the failure at the top, ``ledger.json``
   (not checked: ``"partial": true``). Then the collector aborts the job.

A lost collector leaves no post-mortem: the ranks that notice it say so and
end the job as before. Ranks that are threads of one process (the local
engine) go the same way, over their in-memory queues; as they share one
console, only the first failing rank announces its failure (the collector
still hears of every one), and a rank ended by another's abort ends quietly.
:func:`~gflowdist.runtime.failures.tell_where` is what the launcher
(``gflowdist run``, or the local engine's
:func:`~gflowdist.runtime.in_process.run_in_process`) prints after a
failure: where the post-mortem is and how to resume.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gflowdist.errors import GflowdistError, PeerLostError, ProtocolError
from gflowdist.runtime import protocol
from gflowdist.runtime.failures import LOST_RANK, Failure, PostMortemCalled, RankFailed, describe_failure
from gflowdist.runtime.process import RankProcess, abort_job, announce_failure
from gflowdist.runtime.protocol import Command, MessageType, command_of
from gflowdist.runtime.settings import POSTMORTEM_CAP_S

if TYPE_CHECKING:
    from gflowdist.runtime.collector import Collector
    from gflowdist.runtime.wiring import Wiring

__all__ = [
    "RankFailed",
    "PostMortemCalled",
    "Holding",
    "end_failed",
    "held",
    "wait_s",
    "WAIT_CAP_S",
    "WRITE_S",
    "resume_command",
]

log = logging.getLogger("gflowdist.runtime")

#: The collector waits at most this long (and at most ``faults.peer_timeout_s``) for what the ranks hold.
WAIT_CAP_S = POSTMORTEM_CAP_S
#: What writing the post-mortem may take (report.png under a loaded machine takes seconds): a failed rank
#: waits :func:`wait_s` plus this for the collector to end the job before it ends it itself.
WRITE_S = 60.0


class Holding:
    """What a running rank holds for its post-mortem: its wiring, a way to its extras, the collector (if it is it)."""

    def __init__(self, w: Wiring, extras: Callable[[], dict[str, Any]], collector: Collector | None = None):
        self.w, self.extras, self.collector = w, extras, collector


def wait_s(w: Wiring) -> float:
    """How long the collector waits for the ranks' answers (:attr:`Settings.postmortem_wait_s`)."""
    return w.settings.postmortem_wait_s


def held(holding: Holding, step: int | None) -> dict[str, Any]:
    """My partial final report: role, host, ledger, timers, trace, channel statistics, my step and extras."""
    w = holding.w
    try:
        extras = holding.extras()
    except Exception as err:
        extras = {"summary": {}, "summary_error": f"{type(err).__name__}: {err}"}
    state = w.reports.final_dict(w.context.role.value, {**extras, "partial": True})
    if step is not None:
        state["step"] = step
    return state


def resume_command(run_dir: Path) -> str | None:
    """``gflowdist run --resume RUN_DIR`` when a complete checkpoint is there to resume from, else None."""
    from gflowdist.runtime.checkpoints import candidates

    return f"gflowdist run --resume {run_dir}" if candidates(run_dir) else None


def end_failed(process: RankProcess, holding: Holding | None, err: BaseException) -> NoReturn:
    """End the job from this rank after ``err`` (see the module docstring); never returns."""
    world = process.world
    code = _exit_code(err)
    if world.ranks_are_threads:
        from gflowdist.comm.threads import JobAborted

        if isinstance(err, JobAborted):  # another rank ended the job, and said why
            raise SystemExit(err.code)
    if isinstance(err, PostMortemCalled):  # the run failed elsewhere, and was announced there
        if holding is not None:
            _answer(holding, process.step())
            _wait_for_the_end(holding.w)
        abort_job(world, code)
    failure = _failure_of(process, err)
    # ranks as threads of one process share the console: only the first failing rank says why
    if not isinstance(err, RankFailed) and (not world.ranks_are_threads or world.first_to_fail()):
        announce_failure(failure.text, detail=failure.detail)
    if holding is None or (world.size == 1 and holding.collector is None):
        abort_job(world, code)
    w = holding.w
    w.reports.note("failure", "fault", rank=failure.rank, exception=failure.exception, step=failure.step)
    if holding.collector is None:
        if not (isinstance(err, PeerLostError) and err.rank == w.collector):  # a lost collector hears nothing
            _tell_collector(holding, failure, process.step())
            _wait_for_the_end(w)
        abort_job(world, code)
    try:
        _gather_and_write(process, holding, failure, err)
    except Exception as problem:
        log.exception("the post-mortem could not be written: %s", problem)
    abort_job(world, code)


def _exit_code(err: BaseException) -> int:
    """3 for a lost rank, whichever rank noticed it: the collector (a heartbeat missed) or another rank, whose
    failure reaches the collector relayed (a reply that never came: the timeouts race under load); 130 for an
    interrupt; 1 for the rest."""
    if isinstance(err, PeerLostError) or (isinstance(err, RankFailed) and err.failure.kind == LOST_RANK):
        return 3
    if isinstance(err, KeyboardInterrupt):
        return 130
    return 1


def _failure_of(process: RankProcess, err: BaseException) -> Failure:
    """The failure ``err`` means, on this rank (a lost peer's is the peer's; a relayed one is its rank's)."""
    if isinstance(err, RankFailed):
        return err.failure
    ctx, rank = process.context, process.world.rank
    log_path = process.run_dir / "logs" / f"rank-{rank}.log"
    role, host = ctx.role.value, ctx.host
    if isinstance(err, PeerLostError):
        return Failure(
            rank=err.rank,
            role=err.role or "?",
            host=err.host or "?",
            step=None,
            kind=LOST_RANK,
            exception=f"PeerLostError: {err.reason}",
            frame=None,
            text=f"gflowdist: {err}\n  noticed by {ctx.describe_rank(rank)}, whose log is {log_path}",
            detail=f"gflowdist: {err}",
        )
    if isinstance(err, KeyboardInterrupt):
        return describe_failure(
            err,
            rank=rank,
            role=role,
            host=host,
            step=process.step(),
            log_path=log_path,
            kind="interrupted",
            headline=f"gflowdist: rank {rank} interrupted",
        )
    step = getattr(err, "step", None)  # an error that knows its step (a refused batch's) says it
    step = process.step() if step is None else step
    kind = "refused batch" if type(err).__name__ == "BadBatchError" else "exception"
    return describe_failure(err, rank=rank, role=role, host=host, step=step, log_path=log_path, kind=kind)


def _tell_collector(holding: Holding, failure: Failure, step: int | None) -> None:
    """My failure and what I hold, to the collector (bounded; a collector that cannot hear it is not waited for)."""
    w = holding.w
    try:
        w.control.send(*protocol.failed(failure.to_dict(), held(holding, step)), w.collector, timeout=wait_s(w))
    except (GflowdistError, OSError) as problem:
        log.warning("could not tell the collector of my failure: %s", problem)


def _answer(holding: Holding, step: int | None) -> None:
    w = holding.w
    try:
        w.control.send(*protocol.partial(held(holding, step)), w.collector, timeout=wait_s(w))
    except (GflowdistError, OSError) as problem:
        log.warning("could not send my post-mortem part to the collector: %s", problem)


def _wait_for_the_end(w: Wiring) -> None:
    """Wait for the collector to end the job (it writes the post-mortem first): its abort ends this process, or
    (the torch engine) its ``postmortem`` message saying it is written; at most :func:`wait_s` + :data:`WRITE_S`."""
    deadline = time.monotonic() + wait_s(w) + WRITE_S
    while time.monotonic() < deadline:
        try:
            msg = w.control.try_recv(w.collector)
        except (GflowdistError, OSError):
            msg = None
        if msg is not None and command_of(msg) is Command.POSTMORTEM and msg.body.get("written"):
            return
        if msg is None:
            time.sleep(0.05)


def _gather_and_write(process: RankProcess, holding: Holding, failure: Failure, err: BaseException) -> None:
    """On the collector: ask every live rank for what it holds, wait, write the post-mortem."""
    from gflowdist.runtime.conclusion import conclude_failed

    w, collector = holding.w, holding.collector
    if collector is None:  # only the collector gathers (end_failed sends the others elsewhere)
        return
    states: dict[int, dict[str, Any]] = {w.rank: held(holding, process.step())}
    failures = [failure]
    lost = dict(w.lost)
    if isinstance(err, PeerLostError):
        lost[err.rank] = failure.exception
    if isinstance(err, RankFailed):
        # what its sender held. A lost-rank failure names another rank, the one its sender noticed was gone:
        # filed under that rank, the sender's part was read as the lost rank's (a trainer's, in the buffer's
        # row), the sender was asked again and reported silent, and the lost rank was asked too.
        states[err.sender] = err.state
        if failure.kind == LOST_RANK:
            lost[failure.rank] = failure.exception
    states.update({r: dict(f, partial=False) for r, f in collector.finals.items()})  # those that finished
    asked = [r for r in range(w.comm.size) if r not in states and r not in lost]
    for rank in asked:
        try:
            w.control.isend(*protocol.postmortem(), rank)
        except GflowdistError as problem:
            log.warning("could not ask rank %d for its post-mortem part: %s", rank, problem)
    began = time.monotonic()
    missing = _collect(collector, states, failures, asked, wait_s(w))
    log.info("post-mortem: parts of ranks %s gathered in %.1f s", sorted(states), time.monotonic() - began)
    for named in failures:  # a rank that another noticed was gone is lost, not only silent
        if named.kind == LOST_RANK and named.rank not in states and named.rank not in lost:
            lost[named.rank] = named.exception
    missing = [r for r in missing if r not in lost]
    for rank in lost:
        states[rank] = _last_heard(collector, rank, lost[rank])
    for rank in missing:
        states[rank] = _last_heard(collector, rank, None)
    written = conclude_failed(
        process.run_dir,
        failures,
        states,
        world_size=w.comm.size,
        generation=w.generation,
        missing={r: f"no answer within {wait_s(w):g} s" for r in missing},
        resume=resume_command(process.run_dir),
        notes=[collector.generation_note] if collector.generation_note else [],
        figure=w.settings.figure,
    )
    for rank in states:  # those waiting for the end may go (the torch engine's abort ends only this process)
        if rank != w.rank and rank not in lost and rank not in missing:
            try:
                w.control.isend(*protocol.postmortem(written=written), rank)
            except GflowdistError:
                pass
    try:
        w.control.drain(timeout=1.0)
    except GflowdistError:
        pass


def _collect(
    collector: Collector, states: dict[int, dict[str, Any]], failures: list[Failure], asked: list[int], seconds: float
) -> list[int]:
    """Read the control channel until every rank in ``asked`` answered or ``seconds`` passed; the ranks missing."""
    w = collector.w
    pending = set(asked)
    deadline = time.monotonic() + seconds
    while pending and time.monotonic() < deadline:
        try:
            msg = w.control.try_recv()
        except ProtocolError as problem:
            collector.note_refused(problem)
            continue
        if msg is None:
            time.sleep(0.005)
            continue
        command = command_of(msg)
        if command is Command.FAILED:
            failures.append(Failure.from_dict(msg.body["failure"]))
            states[msg.sender] = msg.body["state"]
        elif command is Command.PARTIAL:
            states[msg.sender] = msg.body["state"]
        elif msg.type is MessageType.LEDGER:
            states[msg.sender] = dict(msg.body, partial=False)
        elif msg.type is MessageType.METRICS:
            collector.record_metrics(msg.sender, msg.body, tell_coordinator=False)
        if msg.sender in states:
            pending.discard(msg.sender)
    return sorted(pending)


def _last_heard(collector: Collector, rank: int, lost: str | None) -> dict[str, Any]:
    """What the collector knows of a rank that sent nothing now: its role, host, last heartbeat and metrics."""
    layout = collector.layout
    beat = collector.lost_actors.beats.get(rank, {})
    produced = int(beat.get("produced", 0)) if isinstance(beat.get("produced", 0), int) else 0
    return {
        "role": layout.role_of(rank).value,
        "host": layout.host_of(rank),
        "partial": True,
        "timing": None,
        "ledger": {"produced": produced, "sent": produced},
        "last_heartbeat": dict(beat),
        "last_metrics": collector.latest.get(rank),
        "step": beat.get("step") if isinstance(beat.get("step"), int) and beat.get("step", -1) >= 0 else None,
        **({"lost": lost} if lost else {"silent": True}),
    }
