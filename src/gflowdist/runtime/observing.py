"""What a rank keeps about its own run besides timers: its timeline trace and its tape of choices.

- :func:`open_trace`: with ``run.trace``, a :class:`~gflowdist.timing.trace.TraceRecorder`
  (``run.trace_events`` events, the newest) that the rank's StepTimer and
  channels feed (:class:`TraceObserver`); the collector writes ``trace.json``.
- :func:`measure_clock_offset`: what to add to this rank's clock to read the
  collector's. Ranks on the collector's host share its monotonic clock (0);
  the others measure it with a few ping-pongs at start-up.
- :func:`open_tape`: the rank's :mod:`~gflowdist.runtime.tape`: recording
  (``run.record``), replaying (``run.replay_of``), or neither.
"""

from __future__ import annotations

import hashlib
import platform
import struct
import time
from pathlib import Path
from typing import Any

import torch

from gflowdist.comm import Communicator
from gflowdist.config import Config, absolute_ref
from gflowdist.context import DistributedContext
from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.runtime.protocol import Tags
from gflowdist.runtime.replaying import ReplayTape
from gflowdist.runtime.tape import RecordingTape, Tape, read_recording, recording_path
from gflowdist.timing.trace import SENT, TOOK, TraceRecorder
from gflowdist.transport import Message, MessageType

__all__ = [
    "TraceObserver",
    "open_trace",
    "measure_clock_offset",
    "open_tape",
    "rank_header",
    "role_file_digests",
    "PINGS",
]

#: Ping-pongs per rank measuring a clock offset; the one with the shortest round trip counts.
PINGS = 8


class TraceObserver:
    """Puts each message a channel sent or took on the trace (heartbeats left out: they are not the run's work)."""

    def __init__(self, trace: TraceRecorder):
        self.trace = trace
        self.clock = trace.clock

    def sent(self, msg_type: MessageType, dst: int, tag: int, seq: int, started: float) -> None:
        if msg_type is not MessageType.HEARTBEAT:
            self.trace.message(SENT, msg_type.name, dst, tag, seq, started, self.clock() - started)

    def took(self, message: Message, tag: int, started: float) -> None:
        if message.type is not MessageType.HEARTBEAT:
            self.trace.message(
                TOOK, message.type.name, message.sender, tag, message.seq, started, self.clock() - started
            )


def open_trace(config: Config) -> TraceRecorder | None:
    """This rank's trace (``run.trace``), on the StepTimer's clock; None without ``run.trace``."""
    return TraceRecorder(config.run.trace_events, clock=time.perf_counter) if config.run.trace else None


def measure_clock_offset(world: Communicator, context: DistributedContext, collector: int, timeout: float) -> float:
    """Collective: seconds to add to my ``time.perf_counter()`` to read the collector's (module docstring).

    A rank on another host sends :data:`PINGS` pings; the collector answers
    each with its clock ``c``; with ``t0``/``t1`` my clock before and after,
    the offset is ``c - (t0 + t1) / 2`` of the fastest round trip (error at
    most half of it).
    """
    layout, me = context.layout, world.rank
    home = layout.host_of(collector)
    others = [r for r in range(world.size) if r != collector and layout.host_of(r) != home]
    if me == collector:
        for rank in others:
            for _ in range(PINGS):
                world.recv(rank, Tags.CLOCK, timeout=timeout)
                world.send(struct.pack("<d", time.perf_counter()), rank, Tags.CLOCK, timeout=timeout)
        return 0.0
    if me not in others:
        return 0.0
    best = (float("inf"), 0.0)
    for _ in range(PINGS):
        t0 = time.perf_counter()
        world.send(b"\0", collector, Tags.CLOCK, timeout=timeout)
        _, payload = world.recv(collector, Tags.CLOCK, timeout=timeout)
        t1 = time.perf_counter()
        (theirs,) = struct.unpack("<d", bytes(payload.numpy().tobytes()))
        best = min(best, (t1 - t0, theirs - (t0 + t1) / 2))
    return best[1]


def rank_header(config: Config, context: DistributedContext) -> dict[str, Any]:
    """What a recording says about the rank and the run it came from (checked when replaying)."""
    from gflowdist import __version__

    return {
        "rank": context.rank,
        "role": context.role.value,
        "host": context.host,
        "world_size": context.world.size,
        "engine": context.world.engine,
        "seed": config.run.seed,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "gflowdist": __version__,
        "python": platform.python_version(),
        "files": role_file_digests(config),
        "config": replayed_settings(config, context.world.size, context.world.engine),
    }


#: ``run`` keys a replay sets itself (where it writes, that it replays): not compared with the recording
REPLAY_OWN_KEYS = ("record", "replay_of", "out_dir", "name")


def replayed_settings(config: Config, world_size: int, engine: str) -> dict[str, Any]:
    """The config as the run directory's config.yaml has it (``gflowdist.rundir.resolved_config``), as
    plain values, less what a replay changes itself (:data:`REPLAY_OWN_KEYS`)."""
    from gflowdist.rundir import resolved_config

    settings = resolved_config(config, world_size, engine)
    settings["run"] = {k: v for k, v in settings["run"].items() if k not in REPLAY_OWN_KEYS}
    return settings


def role_file_digests(config: Config) -> dict[str, str]:
    """SHA-256 of each role file the config names and of the Python files beside it (absolute path -> hex).

    The files beside a role file are the modules a role most often imports (``from hypergrid_gfn
    import ...``); installed packages are left out.
    """
    digests = {}
    for role in ("trainer", "actor", "buffer", "coordinator"):
        ref = getattr(config.roles, role)
        if ref is None:
            continue
        try:
            path = Path(absolute_ref(ref, key=f"roles.{role}", file=config.file).rpartition(":")[0])
        except ConfigError:
            continue
        if path.suffix == ".py" and path.is_file():
            for module in sorted(path.parent.glob("*.py")):
                if str(module) not in digests and module.is_file():
                    digests[str(module)] = hashlib.sha256(module.read_bytes()).hexdigest()
    return digests


def open_tape(config: Config, run_dir: Path, context: DistributedContext) -> Tape:
    """This rank's tape: recording into ``run_dir`` (``run.record``), replaying ``run.replay_of``, or neither."""
    if config.run.record:
        return RecordingTape(recording_path(run_dir, context.rank), rank_header(config, context))
    if config.run.replay_of is None:
        return Tape()
    path = recording_path(config.run.replay_of, context.rank)
    header, events, complete = read_recording(path)
    mine = rank_header(config, context)
    for key in ("world_size", "role"):
        if header.get(key) != mine[key]:
            raise GflowdistError(
                f"{path}: recorded with {key} {header.get(key)!r}, this rank has {mine[key]!r}: "
                f"replay the run with the layout it was recorded with"
            )
    if not complete:
        raise GflowdistError(
            f"{path} ends before its last event (the recorded run did not finish): it cannot be replayed to its end"
        )
    if header.get("threads") and header["threads"] != torch.get_num_threads():
        torch.set_num_threads(int(header["threads"]))  # the same reductions in the same order
    return ReplayTape(
        events, rank=context.rank, role=context.role.value, host=context.host, deadline_s=config.faults.peer_timeout_s
    )
