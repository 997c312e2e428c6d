"""``trace.json``: every rank's timeline in the Chrome trace event format (Perfetto, chrome://tracing).

:func:`chrome_trace` turns the ranks' :meth:`TraceRecorder.to_dict` into one
trace:

- one process per rank (``pid`` = rank), named ``rank 3 buffer @node-a``,
  sorted by rank;
- each phase, collective and message a complete event (``ph: X``) on its
  rank's track; a collective's ``args`` name the member that arrived last and
  this rank's wait on it (:func:`gflowdist.timing.collectives.last_at`);
- each message whose send and take both are in the trace an arrow from the
  start of the send to the end of the take (flow events ``ph: s`` / ``ph: f``,
  matched by sender, receiver, channel and the channel's sequence number);
- checkpoints, faults and stops instant events (``ph: i``).

Time: each rank's clock plus its ``offsets`` entry (seconds) is put on one
line, whose zero is the earliest event. Ranks on one host share a monotonic
clock (offset 0); the runtime measures the others' (docs/trace-replay.md).

Window: a rank whose ring dropped events covers only its last stretch of the
run; everything before the latest such first event is cut from every track,
so all tracks cover the same stretch of time (``otherData.cut_to_common_window``
says whether that happened, ``dropped`` how many events each rank let go).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gflowdist.errors import GflowdistError
from gflowdist.timing.collectives import last_at
from gflowdist.timing.timers import StepTimer
from gflowdist.timing.trace import INSTANT, SENT, SPAN, TOOK, TRACE_FORMAT

__all__ = ["chrome_trace", "write_trace"]

#: How far inside its send / take event an arrow's tail / head is put (seconds).
INSIDE_S = 1e-7


def _start_of(event: list) -> float:
    return event[5] if event[0] in (SENT, TOOK) else event[3]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _dur(ts: float, end: float) -> float:
    """A duration event's ``dur`` such that ``ts + dur == end`` exactly (``end`` rounded like ``ts``): events that
    touch or end together on a track still nest in a viewer that adds ``ts + dur``, not one rounding step off.
    (Where no such float exists, a tie of the rounding, ``ts + dur`` is the largest sum below ``end``.)"""
    dur = round(end - ts, 3)  # short in the JSON, and most often exact
    if ts + dur == end:
        return dur
    dur = end - ts  # exact when ts >= end / 2 (Sterbenz); else dur's steps are end's, nudged below
    for _ in range(4):
        total = ts + dur
        if total == end:
            return dur
        dur = math.nextafter(dur, -math.inf if total > end else math.inf)
    for _ in range(8):
        if ts + dur <= end:
            break
        dur = math.nextafter(dur, -math.inf)
    return dur


class _Builder:
    def __init__(self, origin: float, cut: float, timers: Mapping[int, StepTimer]):
        self.origin, self.cut, self.timers = origin, cut, timers
        self.out: list[dict[str, Any]] = []
        self.sends: dict[tuple, tuple[int, float, str]] = {}
        self.takes: dict[tuple, tuple[int, float]] = {}

    def add(self, rank: int, event: list, shift: float) -> None:
        kind = event[0]
        if _start_of(event) + shift < self.cut:
            return
        if kind == SPAN:
            _, name, cat, start, seconds, args = event
            args = dict(args or {})
            if cat == "collective":
                args.update(self._last_arriver(rank, name, args))
            ts = self.ts(start + shift)
            self.out.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": cat,
                    "pid": rank,
                    "tid": 0,
                    "ts": ts,
                    "dur": _dur(ts, self.ts(start + seconds + shift)),
                    "args": args,
                }
            )
        elif kind == INSTANT:
            _, name, cat, at, args = event
            self.out.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": name,
                    "cat": cat,
                    "pid": rank,
                    "tid": 0,
                    "ts": self.ts(at + shift),
                    "args": dict(args or {}),
                }
            )
        elif kind in (SENT, TOOK):
            self._message(rank, event, shift)
        else:
            raise GflowdistError(f"trace of rank {rank}: unknown event kind {kind!r}")

    def _message(self, rank: int, event: list, shift: float) -> None:
        kind, type_name, peer, tag, seq, start, seconds = event
        sent = kind == SENT
        ts = self.ts(start + shift)
        self.out.append(
            {
                "ph": "X",
                "name": f"{'send' if sent else 'take'} {type_name} {'->' if sent else '<-'} {peer}",
                "cat": "message",
                "pid": rank,
                "tid": 0,
                "ts": ts,
                "dur": _dur(ts, self.ts(start + seconds + shift)),
                "args": {"peer": peer, "tag": tag, "seq": seq},
            }
        )
        # The arrow leaves as the send starts and lands as the take ends (a blocking take may have begun
        # before the send), each a hair inside its event so a viewer binds it there: never back in time.
        inside = min(seconds / 2, INSIDE_S)
        if sent:
            self.sends[(rank, peer, tag, seq)] = (rank, self.ts(start + shift + inside), type_name)
        else:
            self.takes[(peer, rank, tag, seq)] = (rank, self.ts(start + shift + seconds - inside))

    def _last_arriver(self, rank: int, name: str, args: Mapping[str, Any]) -> dict[str, Any]:
        group, index = tuple(args.get("group", ())), args.get("index")
        times = {r: self.timers[r].collectives.get((name, group), []) for r in group if r in self.timers}
        found = last_at(times, index) if index is not None and len(times) == len(group) else None
        if found is None:
            return {"last_arriver": None}
        arrived_last, waits = found
        return {"last_arriver": arrived_last, "waited_on_last_s": round(waits[rank], 9)}

    def flows(self) -> int:
        paired = sorted(set(self.sends) & set(self.takes), key=lambda k: self.sends[k][1])
        for flow_id, key in enumerate(paired, start=1):
            sender, at, type_name = self.sends[key]
            receiver, taken = self.takes[key]
            common = {"name": type_name, "cat": "message", "id": flow_id, "tid": 0}
            self.out.append({"ph": "s", "pid": sender, "ts": at, **common})
            self.out.append({"ph": "f", "bp": "e", "pid": receiver, "ts": taken, **common})
        return len(paired)

    def ts(self, seconds: float) -> float:
        return _us(seconds - self.origin)


def chrome_trace(
    traces: Mapping[int, Mapping[str, Any]],
    *,
    names: Mapping[int, str],
    offsets: Mapping[int, float] | None = None,
    timings: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The trace of a run (module docstring) as a JSON-able dict.

    Args:
        traces: ``{rank: TraceRecorder.to_dict()}``.
        names: ``{rank: track name}``, e.g. ``"rank 3 buffer @node-a"``.
        offsets: ``{rank: seconds to add to its clock}`` (absent: 0).
        timings: ``{rank: StepTimer.to_dict()}``, to name each collective's last arriver.
    """
    offsets = offsets or {}
    for rank, trace in traces.items():
        if trace.get("format") != TRACE_FORMAT:
            raise GflowdistError(f"trace of rank {rank}: format {trace.get('format')!r} is not {TRACE_FORMAT}")
    firsts = {r: min(_start_of(e) for e in t["events"]) + offsets.get(r, 0.0) for r, t in traces.items() if t["events"]}
    cut = max(
        (firsts[r] for r, t in traces.items() if r in firsts and t["recorded"] > len(t["events"])),
        default=float("-inf"),
    )
    origin = max(min(firsts.values(), default=0.0), cut)
    timers = {int(r): StepTimer.from_dict(d) for r, d in (timings or {}).items()}
    builder = _Builder(origin, cut, timers)
    for rank in sorted(traces):
        for event in traces[rank]["events"]:
            builder.add(rank, event, offsets.get(rank, 0.0))
    flows = builder.flows()
    builder.out.sort(key=lambda e: (e["ts"], e["pid"]))
    meta = []
    for rank in sorted(traces):
        meta.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": names.get(rank, f"rank {rank}")}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0, "args": {"name": "main"}})
    return {
        "traceEvents": meta + builder.out,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "gflowdist",
            "cut_to_common_window": cut != float("-inf"),
            "flows": flows,
            "dropped": {str(r): t["recorded"] - len(t["events"]) for r, t in traces.items()},
            "offsets_s": {str(r): offsets.get(r, 0.0) for r in traces},
        },
    }


def write_trace(path: str | os.PathLike[str], trace: Mapping[str, Any]) -> Path:
    """Write :func:`chrome_trace`'s result to ``path`` (a temporary name, then renamed); returns the path."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(trace, separators=(",", ":"), allow_nan=False))  # dumps: C encoder, 3x faster than dump
    os.replace(tmp, path)
    return path
