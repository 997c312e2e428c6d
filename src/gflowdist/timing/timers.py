"""Per-rank timers: phase times per iteration, time blocked on each peer, collectives.

Nothing here talks to other ranks. Each rank owns one :class:`StepTimer`; at the
end of a run the runtime gathers every rank's :meth:`StepTimer.to_dict` (plain
msgpack-able data) and hands them to :func:`gflowdist.timing.build_report`.

The model, in one picture::

    timer = StepTimer()
    for it in range(n_iters):
        with timer.phase("rollout"):           # phases["rollout"].append(seconds)
            trajs = sample()
        with timer.phase("send"):
            with timer.wait_on(buffer_rank, "send"):   # waits[buffer_rank]["send"] += seconds
                channel.send(trajs)
        with timer.phase("train"):
            train(trajs)
    payload = timer.to_dict()                  # gathered later by the runtime

``phases`` is torchgfn's timing format ``{step_name: [seconds per iteration]}``:
every exit of ``phase(name)`` appends one entry, so a phase timed once per
iteration has one entry per iteration. A phase entered several times per
iteration gets several entries; wrap those calls in one block, or sum them and
use :meth:`StepTimer.record`.

``wait_on(peer, label)`` adds the seconds spent inside the block to
``waits[peer][label]`` and counts one wait in ``wait_counts[peer][label]``.
Those totals become the rows of the report's who-waited-on-whom matrix
(row = this rank, column = ``peer``). A ``wait_on`` block inside a ``phase``
block is counted in both: the phase time includes the wait.

``collective(name, group)`` wraps one collective of a group (an all-reduce of
gradients, ...) and appends its seconds to ``collectives[(name, group)]``.
Nobody knows on whom a collective waited until every member's seconds are
together: the report (:mod:`gflowdist.timing.collectives`) names the member
that arrived last and how long each other one waited on it.

With a ``trace`` (:class:`gflowdist.timing.trace.TraceRecorder`) every phase
and collective is also a duration event of the rank's timeline, and so is
every :meth:`StepTimer.record`: an event of the seconds recorded, ending when
they ended (``end``, by default the call), laid out around the track's other
events where one event would cut through them (:meth:`TraceRecorder.stretch`).

Costs: one clock call at entry and one at exit (``time.perf_counter`` unless a
``clock`` is injected), one list append or dict update (a second append into
the trace's ring when there is one); no locks, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gflowdist.errors import GflowdistError

if TYPE_CHECKING:
    from gflowdist.timing.trace import TraceRecorder

__all__ = ["StepTimer", "STEP_TIMER_FORMAT"]

#: Version of the :meth:`StepTimer.to_dict` layout; :meth:`StepTimer.from_dict` checks it.
STEP_TIMER_FORMAT = 1

Clock = Callable[[], float]


class _TimedBlock:
    """Context manager of :meth:`StepTimer.phase` / :meth:`StepTimer.wait_on`.

    On exit (also by an exception) it passes the seconds spent inside to ``done``.
    """

    __slots__ = ("_clock", "_done", "_start")

    def __init__(self, clock: Clock, done: Callable[[float], None]):
        self._clock = clock
        self._done = done
        self._start = 0.0

    def __enter__(self) -> _TimedBlock:
        self._start = self._clock()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done(self._clock() - self._start)


class _TracedBlock(_TimedBlock):
    """A :class:`_TimedBlock` that also puts the block on the trace's timeline (a duration event).

    While it runs its start is on ``opened`` (the timer's open blocks): a time
    recorded inside it (:meth:`StepTimer.record`) must not begin before it.
    """

    __slots__ = ("_args", "_cat", "_name", "_opened", "_trace")

    def __init__(
        self,
        clock: Clock,
        done: Callable[[float], None],
        trace: TraceRecorder,
        name: str,
        cat: str,
        opened: list[float],
        args: dict[str, Any] | None = None,
    ):
        super().__init__(clock, done)
        self._trace, self._name, self._cat, self._args, self._opened = trace, name, cat, args, opened

    def __enter__(self) -> _TracedBlock:
        self._start = self._clock()
        self._opened.append(self._start)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        seconds = self._clock() - self._start
        self._opened.pop()
        self._done(seconds)
        self._trace.span(self._name, self._cat, self._start, seconds, self._args)


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise GflowdistError(f"{what} must be a non-empty string, got {name!r}")
    return name


def _check_peer(peer: object) -> int:
    if isinstance(peer, bool) or not isinstance(peer, int) or peer < 0:
        raise GflowdistError(f"peer rank must be an int >= 0, got {peer!r}")
    return peer


def _check_seconds(seconds: object, what: str) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise GflowdistError(f"{what} must be a number of seconds, got {seconds!r}")
    value = float(seconds)
    if not math.isfinite(value) or value < 0.0:
        raise GflowdistError(f"{what} must be finite and >= 0 seconds, got {seconds!r}")
    return value


class StepTimer:
    """Seconds per iteration per phase, and seconds blocked per peer, on one rank.

    Args:
        clock: a callable returning seconds as a float, monotonic; defaults to
            ``time.perf_counter``. Tests inject a fake clock.

        trace: a :class:`~gflowdist.timing.trace.TraceRecorder` that also gets
            every phase and collective as a duration event (None: no trace).
            It must use the same clock.

    State (read-only views; mutate through the methods):
        ``phases``: ``{phase: [seconds, ...]}``, one entry per timed block.
        ``waits``: ``{peer_rank: {label: total seconds blocked}}``.
        ``wait_counts``: ``{peer_rank: {label: number of waits}}``.
        ``collectives``: ``{(name, group): [seconds, ...]}``, one entry per collective,
        ``group`` the members' world ranks, ascending.
    """

    __slots__ = ("_clock", "_opened", "collectives", "phases", "trace", "wait_counts", "waits")

    def __init__(self, *, clock: Clock = time.perf_counter, trace: TraceRecorder | None = None):
        if not callable(clock):
            raise GflowdistError(f"clock must be a callable returning seconds, got {clock!r}")
        self._clock = clock
        self.phases: dict[str, list[float]] = {}
        self.waits: dict[int, dict[str, float]] = {}
        self.wait_counts: dict[int, dict[str, int]] = {}
        self.collectives: dict[tuple[str, tuple[int, ...]], list[float]] = {}
        self.trace = trace
        self._opened: list[float] = []  # starts of the traced blocks open now, outermost first

    # --- recording ----------------------------------------------------------------------

    def phase(self, name: str) -> _TimedBlock:
        """``with timer.phase(name):`` appends the block's seconds to ``phases[name]``.

        The time is recorded even when the block raises (the time was spent).
        """
        done = partial(self._append, _check_name(name, "phase name"))
        if self.trace is None:
            return _TimedBlock(self._clock, done)
        return _TracedBlock(self._clock, done, self.trace, name, "phase", self._opened)

    def wait_on(self, peer_rank: int, label: str = "wait") -> _TimedBlock:
        """``with timer.wait_on(peer, label):`` adds the block's seconds to ``waits[peer][label]``.

        Wrap exactly the blocking call (a receive from ``peer``, a send waiting
        for ``peer`` to drain, a sample request served by ``peer``).
        """
        return _TimedBlock(
            self._clock, partial(self._add_wait, _check_peer(peer_rank), _check_name(label, "wait label"))
        )

    def collective(self, name: str, group: Sequence[int]) -> _TimedBlock:
        """``with timer.collective(name, group):`` wraps one collective; its seconds go to ``collectives``.

        ``group``: the world ranks of the collective's members (every member
        wraps the same collectives in the same order, so the ``i``-th entries
        of the members belong to one collective). Wrap the whole call, from
        this rank's arrival to its departure.
        """
        key = (_check_name(name, "collective name"), tuple(sorted(_check_peer(r) for r in group)))
        done = partial(self._add_collective, key)
        if self.trace is None:
            return _TimedBlock(self._clock, done)
        index = len(self.collectives.get(key, ()))  # which of the group's collectives of this name
        return _TracedBlock(
            self._clock, done, self.trace, name, "collective", self._opened, {"group": list(key[1]), "index": index}
        )

    def record(self, name: str, seconds: float, *, end: float | None = None) -> None:
        """Append one iteration's ``seconds`` to ``phases[name]`` (for times measured elsewhere).

        With a trace, the seconds are also a duration event ``name`` ending at
        ``end`` (the timer's clock when the time ended; default, and at the
        latest: now), from ``end - seconds``. Where
        that would cut through an event already on the track (it began before
        and ends inside, e.g. a message sent during an idle stretch whose
        seconds are a sum over many polls) or through a traced block still open
        around this call, the seconds are laid out, going back from ``end``, in
        the track's free time: several events ``name`` of the same total
        (:meth:`TraceRecorder.stretch <gflowdist.timing.trace.TraceRecorder.stretch>`).
        """
        name = _check_name(name, "phase name")
        value = _check_seconds(seconds, f"time of phase {name!r}")
        if end is not None and (isinstance(end, bool) or not isinstance(end, (int, float)) or not math.isfinite(end)):
            raise GflowdistError(f"end of phase {name!r} must be a finite clock reading, got {end!r}")
        self._append(name, value)
        if self.trace is not None:
            now = self._clock()
            at = now if end is None else min(float(end), now)  # the ring is in the order events ended
            floor = next((start for start in reversed(self._opened) if start < at), float("-inf"))
            self.trace.stretch(name, "phase", at, value, floor)

    def record_wait(self, peer_rank: int, label: str, seconds: float) -> None:
        """Add ``seconds`` blocked on ``peer_rank`` under ``label`` and count one wait."""
        peer = _check_peer(peer_rank)
        self._add_wait(peer, _check_name(label, "wait label"), _check_seconds(seconds, f"wait on rank {peer}"))

    # fast paths for the context managers: arguments were checked when the block was made,
    # and the clock is monotonic
    def _append(self, name: str, seconds: float) -> None:
        times = self.phases.get(name)
        if times is None:
            self.phases[name] = [seconds]
        else:
            times.append(seconds)

    def _add_collective(self, key: tuple[str, tuple[int, ...]], seconds: float) -> None:
        times = self.collectives.get(key)
        if times is None:
            self.collectives[key] = [seconds]
        else:
            times.append(seconds)

    def _add_wait(self, peer: int, label: str, seconds: float) -> None:
        per_label = self.waits.setdefault(peer, {})
        per_label[label] = per_label.get(label, 0.0) + seconds
        counts = self.wait_counts.setdefault(peer, {})
        counts[label] = counts.get(label, 0) + 1

    # --- reading ------------------------------------------------------------------------

    def total(self, name: str) -> float:
        """Sum of ``phases[name]`` (0.0 for a phase never timed)."""
        return math.fsum(self.phases.get(name, ()))

    def waited_on(self, peer_rank: int) -> float:
        """Total seconds blocked on ``peer_rank`` over every label."""
        return math.fsum(self.waits.get(peer_rank, {}).values())

    # --- wire form ----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain, msgpack- and JSON-able data; peer ranks become ``str`` keys.

        Layout (``format`` is :data:`STEP_TIMER_FORMAT`)::

            {"format": 1,
             "phases": {"rollout": [0.12, 0.11, ...], ...},
             "waits": {"3": {"sample": 1.75}, ...},       # seconds blocked on rank 3
             "wait_counts": {"3": {"sample": 40}, ...},
             "collectives": [{"name": "gradients", "group": [0, 1], "seconds": [0.004, ...]}, ...]}

        ``collectives`` is left out when there are none.
        """
        out = {
            "format": STEP_TIMER_FORMAT,
            "phases": {name: list(times) for name, times in self.phases.items()},
            "waits": {str(peer): dict(labels) for peer, labels in self.waits.items()},
            "wait_counts": {str(peer): dict(labels) for peer, labels in self.wait_counts.items()},
        }
        if self.collectives:
            out["collectives"] = [
                {"name": name, "group": list(group), "seconds": list(times)}
                for (name, group), times in self.collectives.items()
            ]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, clock: Clock = time.perf_counter) -> StepTimer:
        """Rebuild a timer from :meth:`to_dict` output (peer keys may be ``str`` or ``int``).

        Raises:
            GflowdistError: unknown format version, unknown keys, or values of the wrong type.
        """
        if not isinstance(data, Mapping):
            raise GflowdistError(f"StepTimer data must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"format", "phases", "waits", "wait_counts", "collectives"}
        if unknown:
            raise GflowdistError(f"StepTimer data has unknown keys {sorted(map(str, unknown))}")
        if data.get("format") != STEP_TIMER_FORMAT:
            raise GflowdistError(
                f"StepTimer data format {data.get('format')!r} is not supported (expected {STEP_TIMER_FORMAT})"
            )
        timer = cls(clock=clock)
        for name, times in _mapping(data.get("phases", {}), "phases").items():
            timer.phases[_check_name(name, "phase name")] = [
                _check_seconds(t, f"time of phase {name!r}") for t in _sequence(times, name)
            ]
        for peer_key, labels in _mapping(data.get("waits", {}), "waits").items():
            peer = parse_rank(peer_key, "waits")
            timer.waits[peer] = {
                _check_name(label, "wait label"): _check_seconds(s, f"wait on rank {peer}")
                for label, s in _mapping(labels, f"waits[{peer_key!r}]").items()
            }
        for peer_key, labels in _mapping(data.get("wait_counts", {}), "wait_counts").items():
            peer = parse_rank(peer_key, "wait_counts")
            timer.wait_counts[peer] = {
                _check_name(label, "wait label"): _check_count(n, f"wait count on rank {peer}")
                for label, n in _mapping(labels, f"wait_counts[{peer_key!r}]").items()
            }
        for entry in _sequence(data.get("collectives", []), "collectives"):
            entry = _mapping(entry, "collectives entry")
            name = _check_name(entry.get("name"), "collective name")
            group = tuple(sorted(_check_peer(r) for r in _sequence(entry.get("group", ()), f"{name} group")))
            timer.collectives[(name, group)] = [
                _check_seconds(t, f"time of collective {name!r}") for t in _sequence(entry.get("seconds", ()), name)
            ]
        return timer

    @classmethod
    def from_timing_dict(cls, timing: Mapping[str, Any], *, clock: Clock = time.perf_counter) -> StepTimer:
        """Adopt a torchgfn timing dict ``{step_name: [seconds per iteration]}``.

        A bare number for a step counts as one iteration, as torchgfn's reports do.
        """
        timer = cls(clock=clock)
        for name, times in _mapping(timing, "timing dict").items():
            for t in as_time_list(times, name):
                timer.record(name, t)
        return timer


def as_time_list(times: object, step: str) -> list[float]:
    """A step's times as floats: a list/tuple of seconds, or one number (= one iteration)."""
    if isinstance(times, (int, float)) and not isinstance(times, bool):
        return [_check_seconds(times, f"time of step {step!r}")]
    return [_check_seconds(t, f"time of step {step!r}") for t in _sequence(times, step)]


def parse_rank(key: object, where: str) -> int:
    """A rank from an ``int`` or a decimal ``str`` key (msgpack/JSON turn int keys into str)."""
    if isinstance(key, bool):
        raise GflowdistError(f"{where}: rank key must be an int or a decimal string, got {key!r}")
    if isinstance(key, int):
        rank = key
    elif isinstance(key, str) and key.strip().lstrip("-").isdigit():
        rank = int(key)
    else:
        raise GflowdistError(f"{where}: rank key must be an int or a decimal string, got {key!r}")
    if rank < 0:
        raise GflowdistError(f"{where}: rank must be >= 0, got {key!r}")
    return rank


def _check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GflowdistError(f"{what} must be an int >= 0, got {value!r}")
    return value


def _mapping(value: object, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise GflowdistError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


def _sequence(value: object, what: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise GflowdistError(f"times of {what!r} must be a list of seconds, got {type(value).__name__}")
    return list(value)
