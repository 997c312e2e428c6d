"""The collector: the rank that hears everyone (the coordinator, else rank 0).

It reads the CONTROL channel: heartbeats (liveness), metrics (progress line,
metrics.jsonl), role summaries, and every rank's final report (ledger,
timers, staleness). A rank silent for longer than ``faults.peer_timeout_s``
is declared lost with :class:`~gflowdist.errors.PeerLostError` naming its
rank, role and host; with ``faults.on_actor_loss: continue`` a lost actor is
gone on without instead (:mod:`gflowdist.runtime.lost_actors`).

A control message it cannot read (garbage, a size over
``faults.max_message_bytes``, a sequence gap) raises
:class:`~gflowdist.errors.ProtocolError`; the collector counts it per sender
(:attr:`Collector.refused`, and ``malformed`` in its ledger, so it reaches
ledger.json and the final line), logs it, and keeps serving. The log is
rate-limited: refusal number ``k`` (counted over all senders, from 1) is
logged when ``k <= LOG_FIRST_REFUSALS`` or ``k % LOG_EVERY_REFUSAL == 0``,
so a flood of ``m`` bad messages writes at most
``LOG_FIRST_REFUSALS + m // LOG_EVERY_REFUSAL`` lines, plus one line of
totals per sender when the last final report has arrived.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gflowdist.errors import PeerLostError, ProtocolError
from gflowdist.layout import Role
from gflowdist.runtime.failures import Failure, RankFailed
from gflowdist.runtime.generations import Reach
from gflowdist.runtime.history import GenerationFacts
from gflowdist.runtime.lost_actors import LostActors
from gflowdist.runtime.progress import progress_line
from gflowdist.runtime.protocol import Command, MessageType, command_of
from gflowdist.runtime.replacing import Replacer
from gflowdist.runtime.tape import FREE, Site
from gflowdist.runtime.wiring import Wiring
from gflowdist.transport import Message

if TYPE_CHECKING:
    from gflowdist.timing.tensorboard_live import LiveBoard

__all__ = ["Collector", "LOG_FIRST_REFUSALS", "LOG_EVERY_REFUSAL"]

log = logging.getLogger("gflowdist.runtime")

#: Refused control messages logged one by one before the log thins out.
LOG_FIRST_REFUSALS = 10
#: After the first ones, every this many-th refusal is logged (with the running total).
LOG_EVERY_REFUSAL = 100


def is_heartbeat(msg: Message) -> bool:
    """Heartbeats are not choices: a replay lets them through whenever they come."""
    return msg.type is MessageType.HEARTBEAT


class Collector:
    """The collector's state and duties on its rank (the module docstring says what it hears).

    Built by the job runner on the coordinator (else rank 0) and polled from
    that rank's loop: :meth:`poll` reads the control channel, keeps each
    rank's last heartbeat, metrics and summary, writes metrics.jsonl and the
    progress line, declares silent ranks lost, and gathers the final reports
    that :func:`~gflowdist.runtime.conclusion.conclude` turns into the report
    and the ledger check.
    """

    def __init__(
        self,
        w: Wiring,
        *,
        metrics_file: TextIO | None,
        run_dir: Path | None = None,
        on_metrics: Callable[..., Any] | None = None,
        on_summary: Callable[..., Any] | None = None,
        extra_fields: Callable[[], dict[str, Any]] | None = None,
        on_weights: Callable[..., Any] | None = None,
        out: TextIO = sys.stdout,
        start_step: int = 0,
        producer: type | None = None,
    ):
        self.w = w
        self.layout = w.context.layout
        self.others = [r for r in range(w.comm.size) if r != w.rank]
        now = time.monotonic()
        self.last_seen = {r: now for r in self.others}
        self.finals: dict[int, dict[str, Any]] = {}
        self.latest: dict[int, dict[str, Any]] = {}  # trainer or actor rank -> last metrics
        self.metrics_file = metrics_file
        self.on_metrics = on_metrics
        self.on_summary = on_summary
        self.on_weights = on_weights
        self.extra_fields = extra_fields or (lambda: {})
        self.out = out
        self.refused: Counter[int] = Counter()  # sender rank -> control messages refused (ProtocolError)
        self.started = time.monotonic()
        self.run_dir = run_dir
        self.saved: dict[
            str, dict[int, dict[str, Any]]
        ] = {}  # periodic checkpoint name -> rank -> its file's size, digest
        self.line = progress_line(w, out, start_step=start_step, producer=producer)
        self.lost_actors = LostActors(w, self.line.say)
        self.replacer = Replacer(w, self.line.say, run_dir)
        self.reach = Reach(run_dir, w.generation)  # how far the trainers got (progress.json)
        self.generation_note: str | None = None  # which generation, why the one before ended (set by the job)
        self.board: LiveBoard | None = (
            None  # run.tensorboard: a LiveBoard the job opens (gflowdist.timing.tensorboard_live)
        )
        self.line.heard(w.rank, w.ledger.produced)  # my own count when this generation began

    # -- one poll ---------------------------------------------------------------
    def poll(self, budget: int = 64, *, point: int = FREE) -> bool:
        """Handle up to ``budget`` waiting messages besides heartbeats; True if any arrived. Raises PeerLostError.

        ``point``: the step of the trainer this collector runs on (FREE in the
        coordinator's loop and at the end): a replay takes there the messages
        the recorded run took there (:meth:`Choices.take <gflowdist.runtime.choices.Choices.take>`).
        """
        got, handled = False, 0
        self.w.liveness.heartbeat(0)
        while handled < budget:
            try:
                msg = self.w.choices.take(
                    Site.CONTROL, self.w.control, point, wait=point != FREE, transparent=is_heartbeat
                )
            except ProtocolError as err:
                handled += 1
                self.note_refused(err)
                continue
            if msg is None:
                break
            got = True
            handled += msg.type is not MessageType.HEARTBEAT
            self.last_seen[msg.sender] = time.monotonic()
            self._handle(msg)
        self._check_liveness()
        return got

    @property
    def protocol_errors(self) -> int:
        """Control messages refused so far, from every sender."""
        return sum(self.refused.values())

    def note_refused(self, err: ProtocolError) -> None:
        """Count a refused control message (by sender) and log it, rate-limited (module docstring)."""
        sender = err.sender if err.sender is not None else -1  # -1: unnamed (a channel always names it)
        self.refused[sender] += 1
        self.w.ledger.malformed[sender] += 1
        self.w.reports.note("malformed message", "fault", sender=sender)
        total = self.protocol_errors
        if total <= LOG_FIRST_REFUSALS:
            more = (
                f" (further refusals are logged every {LOG_EVERY_REFUSAL}th, totals at the end)"
                if total == LOG_FIRST_REFUSALS
                else ""
            )
            log.warning("collector refused a control message: %s%s", err, more)
        elif total % LOG_EVERY_REFUSAL == 0:
            log.warning("collector refused %d control messages so far; the latest: %s", total, err)

    def log_refusal_totals(self) -> None:
        """One line with the refused control messages per sender (nothing if none)."""
        if self.refused:
            per_sender = ", ".join(f"rank {rank}: {n}" for rank, n in sorted(self.refused.items()))
            log.warning("collector refused %d control messages in total (%s)", self.protocol_errors, per_sender)

    def _handle(self, msg: Message) -> None:
        body = msg.body
        if msg.type is MessageType.METRICS:
            self.record_metrics(msg.sender, body)
        elif msg.type is MessageType.USER and self.on_summary is not None:
            self.on_summary(msg.sender, body)
        elif msg.type is MessageType.WEIGHTS and self.on_weights is not None:
            self.on_weights(msg.sender, body["state"], int(body["version"]))
        elif msg.type is MessageType.LEDGER:
            self.finals[msg.sender] = body
            self.w.liveness.heard_final(msg.sender)
        elif msg.type is MessageType.HEARTBEAT:
            self.replacer.heard(msg.sender)
            self.lost_actors.heard(msg.sender, body)
            self.line.heard(msg.sender, int(body.get("produced", 0)))
            if self.layout.role_of(msg.sender) is Role.TRAINER and isinstance(body.get("step"), int):
                self.reach.note(msg.sender, body["step"])
        elif command_of(msg) is Command.ADOPTED:
            self.replacer.adopted(msg.sender, body)
        elif command_of(msg) is Command.SAVED:
            self.note_saved(body["name"], msg.sender, body["file"])
        elif command_of(msg) is Command.REFUSED:  # I am a trainer too, and my buffer refused my batch
            self.w.liveness.refused(body)
        elif command_of(msg) is Command.FAILED:  # the run ends: its post-mortem (runtime.postmortem)
            raise RankFailed(Failure.from_dict(body["failure"]), body["state"], msg.sender)

    def note_saved(self, name: str, rank: int, file: dict[str, Any]) -> None:
        """A rank saved its part of periodic checkpoint ``name`` (``file``: size, digest); the last completes it."""
        ranks = self.saved.setdefault(name, {})
        if not ranks and self.w.context.role is Role.COORDINATOR and self.w.reports.saver is not None:
            # the coordinator's own part (its state is not on the cut)
            ranks[self.w.rank] = self.w.reports.save_part(name)
        ranks[rank] = file
        if len(ranks) + len(set(self.w.lost) - set(ranks)) == self.w.comm.size and self.run_dir is not None:
            self.complete(name, ranks, self.run_dir)
            del self.saved[name]

    def lost_slot(self, rank: int, finals: Mapping[int, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Lost actor ``rank``'s slot in a checkpoint: the counts of its last process only (a replaced one's are
        the manifest's ``replaced``: :meth:`Replacer.last_process <gflowdist.runtime.replacing.Replacer.last_process>`)."""
        lost = self.lost_actors
        return lost.payload(rank, self.replacer.last_process(rank, lost.ledger_of(rank, finals), lost.beats))

    def complete(self, name: str, files: dict[int, dict[str, Any]], run_dir: Path) -> None:
        """Write checkpoint ``name``'s manifest; a lost actor's slot gets its ledger (:mod:`.lost_actors`)."""
        from gflowdist.runtime.checkpoints import save_rank, write_manifest

        for rank in sorted(set(self.w.lost) - set(files)):
            files[rank] = save_rank(run_dir, name, rank, self.lost_slot(rank))
        lost = {str(r): self.w.lost[r] for r in sorted(self.w.lost)}
        replaced = {str(r): ledger.to_dict() for r, ledger in self.replacer.earlier_ledgers().items()}
        write_manifest(
            run_dir,
            name,
            {
                "world_size": self.w.comm.size,
                "generation": self.w.generation,
                "complete": True,
                **({"lost": lost} if lost else {}),
                **({"replaced": replaced} if replaced else {}),
            },
            files=files,
        )
        log.info("checkpoint %s complete", name)

    def record_metrics(self, rank: int, body: dict[str, Any], *, tell_coordinator: bool = True) -> None:
        """A row of metrics.jsonl from ``rank`` (``tell_coordinator`` False: the coordinator's own row)."""
        self.latest[rank] = body
        if isinstance(body.get("step"), int):
            self.reach.note(rank, body["step"] + 1)
        if self.metrics_file is not None:
            self.metrics_file.write(
                json.dumps({"rank": rank, "time": round(time.monotonic() - self.started, 3), **body}) + "\n"
            )
        if self.board is not None:
            self.board.add(rank, body)
        if self.on_metrics is not None and tell_coordinator:
            self.on_metrics(rank, body.get("step", 0), body)

    def _check_liveness(self) -> None:
        self.replacer.watch_spares()
        limit = self.w.settings.rank_silence_s
        now = time.monotonic()
        for rank, seen in self.last_seen.items():
            if rank in self.finals or rank in self.w.lost or now - seen <= limit:
                continue
            reason = f"no heartbeat for {now - seen:.1f} s (faults.peer_timeout_s = {limit:g})"
            reason = self.replacer.silence(rank, reason)
            if not self.lost_actors.may_go_on_without(rank):
                raise PeerLostError(
                    rank, role=self.layout.role_of(rank).value, host=self.layout.host_of(rank), reason=reason
                )
            self.lost_actors.go_on_without(rank, reason, self.replacer.no_spare_left())
            if self.replacer.may_replace(rank):
                self.replacer.replace(rank, reason, int(self.lost_actors.beats.pop(rank, {}).get("produced", 0)))
                # a replacement's first heartbeat may take its role's setup time
                self.last_seen[rank] = time.monotonic() + self.replacer.grace_s()

    def all_reported(self) -> bool:
        """Every other rank sent its final report, or is lost and gone on without."""
        return all(rank in self.finals or rank in self.w.lost for rank in self.others)

    # -- progress -----------------------------------------------------------------
    def progress(self, force: bool = False) -> None:
        """The progress line (:mod:`gflowdist.runtime.progress`), when it is due or ``force``."""
        if not self.line.due(force) or not self.latest:
            return
        extra = {**self.lost_actors.progress_field(), **self.extra_fields()}
        self.line.write(self.line.fields(self.latest, extra))

    def finish_line(self) -> None:
        self.line.finish()

    def facts(self) -> GenerationFacts:
        """What the run's end needs to know of this generation (:mod:`gflowdist.runtime.history`)."""
        flood = self.flood_note()
        return GenerationFacts(
            generation=self.w.generation,
            from_step=self.line.start_step,
            seconds=time.monotonic() - self.started,
            produced_before=sum(self.line.baseline.values()),
            unit=self.line.unit,
            warnings=((flood,) if flood else ()) + self.replacer.spare_notes(),
            curves=self.w.settings.curves,
            figure=self.w.settings.figure,
        )

    def flood_note(self) -> str | None:
        """The report's note when the actors flooded the learners (as the last progress line judged)."""
        return None if self.line.last_flood is None else self.line.last_flood.note()

    # -- the end ------------------------------------------------------------------
    def wait_finals(self, poll_sleep: float = 0.005) -> dict[int, dict[str, Any]]:
        """Collect every other rank's final report (bounded by the liveness check); lost actors send none."""
        from gflowdist.comm.polling import Backoff

        backoff = Backoff(spin_s=0.0, first_sleep_s=poll_sleep, max_sleep_s=0.02)
        while not self.all_reported():
            if not self.poll():
                self.progress()
                backoff.pause()
            else:
                backoff.reset()
        self.log_refusal_totals()
        return self.finals
