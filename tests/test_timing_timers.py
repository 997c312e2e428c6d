"""StepTimer, Throughput and ETA helpers, driven by a fake clock (no sleeps)."""

from __future__ import annotations

import json
import math

import msgpack
import pytest

from gflowdist.errors import GflowdistError
from gflowdist.timing import StepTimer, Throughput, eta_seconds, format_duration
from gflowdist.timing.trace import SENT, SPAN, TOOK, TraceRecorder
from gflowdist.timing.trace_file import chrome_trace
from tests.support.trace_checks import nested_on_each_track


class FakeClock:
    """A clock that only moves when told to; binary-exact steps keep sums exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_phase_records_one_entry_per_block(clock: FakeClock) -> None:
    timer = StepTimer(clock=clock)
    for seconds in (0.5, 0.25, 1.0):
        with timer.phase("rollout"):
            clock.advance(seconds)
        with timer.phase("train"):
            clock.advance(2 * seconds)
    assert timer.phases == {"rollout": [0.5, 0.25, 1.0], "train": [1.0, 0.5, 2.0]}
    assert timer.total("rollout") == 1.75
    assert timer.total("never") == 0.0


def test_nested_phase_includes_inner_and_wait(clock: FakeClock) -> None:
    timer = StepTimer(clock=clock)
    with timer.phase("iteration"):
        clock.advance(0.5)
        with timer.phase("send"):
            with timer.wait_on(3, "send"):
                clock.advance(0.25)
    assert timer.phases["iteration"] == [0.75]
    assert timer.phases["send"] == [0.25]
    assert timer.waits == {3: {"send": 0.25}}


def test_phase_time_is_recorded_when_block_raises(clock: FakeClock) -> None:
    timer = StepTimer(clock=clock)
    with pytest.raises(RuntimeError):
        with timer.phase("rollout"):
            clock.advance(0.5)
            raise RuntimeError("boom")
    assert timer.phases["rollout"] == [0.5]


def test_wait_on_accumulates_per_peer_and_label(clock: FakeClock) -> None:
    timer = StepTimer(clock=clock)
    for peer, label, seconds in [(3, "sample", 0.5), (3, "sample", 0.25), (3, "weights", 1.0), (5, "sample", 2.0)]:
        with timer.wait_on(peer, label):
            clock.advance(seconds)
    assert timer.waits == {3: {"sample": 0.75, "weights": 1.0}, 5: {"sample": 2.0}}
    assert timer.wait_counts == {3: {"sample": 2, "weights": 1}, 5: {"sample": 1}}
    assert timer.waited_on(3) == 1.75
    assert timer.waited_on(4) == 0.0


def test_default_clock_measures_nonnegative_time() -> None:
    timer = StepTimer()
    with timer.phase("x"):
        sum(range(1000))
    assert len(timer.phases["x"]) == 1 and timer.phases["x"][0] >= 0.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), True, "1.0"])
def test_record_rejects_bad_seconds(bad: object) -> None:
    with pytest.raises(GflowdistError, match="phase 'x'"):
        StepTimer().record("x", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", 3, None])
def test_phase_rejects_bad_names(name: object) -> None:
    with pytest.raises(GflowdistError, match="phase name"):
        StepTimer().phase(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("peer", [-1, 1.5, True, "3"])
def test_wait_on_rejects_bad_peers(peer: object) -> None:
    with pytest.raises(GflowdistError, match="peer rank"):
        StepTimer().wait_on(peer, "sample")  # type: ignore[arg-type]


def _traced(clock: FakeClock) -> tuple[StepTimer, TraceRecorder]:
    trace = TraceRecorder(100, clock=clock)
    return StepTimer(clock=clock, trace=trace), trace


def _spans(trace: TraceRecorder, name: str) -> list[tuple[float, float]]:
    return [(e[3], e[3] + e[4]) for e in trace.events if e[0] == SPAN and e[1] == name]


def _nested(trace: TraceRecorder) -> bool:
    """Whether the track's duration events nest or follow each other in trace.json (as trace viewers need)."""
    return nested_on_each_track(chrome_trace({0: trace.to_dict()}, names={})["traceEvents"])


def _ends_in_order(trace: TraceRecorder) -> bool:
    ends = [e[3] + (0 if e[0] == 1 else e[4]) if e[0] in (0, 1) else e[5] + e[6] for e in trace.events]
    return ends == sorted(ends)


def test_record_puts_the_time_on_the_trace_ending_now_or_at_end(clock: FakeClock) -> None:
    timer, trace = _traced(clock)
    clock.advance(2.0)
    timer.record("idle", 0.5)
    timer.record("collect", 0.25, end=101.0)  # measured elsewhere: it ended before the idle above
    assert timer.phases == {"idle": [0.5], "collect": [0.25]}
    assert [tuple(e) for e in trace.events] == [
        (SPAN, "collect", "phase", 100.75, 0.25, None),
        (SPAN, "idle", "phase", 101.5, 0.5, None),
    ]  # in the order they ended
    with pytest.raises(GflowdistError, match="end of phase 'x'"):
        timer.record("x", 0.5, end=float("nan"))
    assert "x" not in timer.phases
    StepTimer(clock=clock).record("idle", 0.5)  # no trace: nothing else to do


def test_an_idle_stretch_summed_over_polls_is_laid_out_around_a_message_sent_in_it(clock: FakeClock) -> None:
    """The buffer's idle: pauses [100.5, 100.75] and [101.375, 101.875], a summary sent between them (100.75 to
    101.25), an untraced poll (101.25 to 101.375). One event [101.875 - 0.75, 101.875] would cut through the
    send: the 0.75 s are laid out in the free time before the end, around the send, after the insert."""
    timer, trace = _traced(clock)
    with timer.phase("insert"):
        clock.advance(0.5)
    clock.advance(0.25)
    trace.message(SENT, "USER", 3, 2, 0, clock.now, 0.5)
    clock.advance(0.5 + 0.125 + 0.5)
    timer.record("idle", 0.75)
    assert timer.phases["idle"] == [0.75]
    assert _spans(trace, "idle") == [(100.625, 100.75), (101.25, 101.875)]
    assert all(e[5] == {"stretch_s": 0.75} for e in trace.events if e[0] == SPAN and e[1] == "idle")
    assert _nested(trace) and _ends_in_order(trace)


def test_a_time_recorded_before_the_turn_that_ended_it_nests_with_that_turn(clock: FakeClock) -> None:
    """The coordinator: an idle stretch of turns until 100.5, then a turn (100.5 to 101.0) that took a message; its
    idle is recorded at the end of that turn, ending where the turn began, then the turn itself."""
    timer, trace = _traced(clock)
    clock.advance(0.75)
    trace.message(TOOK, "METRICS", 0, 2, 5, 100.75, 0.125)
    clock.advance(0.25)
    timer.record("idle", 0.5, end=100.5)
    timer.record("collect", 0.5, end=101.0)
    assert _spans(trace, "idle") == [(100.0, 100.5)] and _spans(trace, "collect") == [(100.5, 101.0)]
    assert _nested(trace) and _ends_in_order(trace)


def test_a_time_recorded_inside_an_open_phase_stays_inside_it(clock: FakeClock) -> None:
    timer, trace = _traced(clock)
    with timer.phase("step"):
        clock.advance(0.25)
        timer.record("wait", 1.0)  # longer than the phase has lasted: only its last 0.25 s fit inside
        clock.advance(0.25)
    assert timer.phases == {"wait": [1.0], "step": [0.5]}
    assert _spans(trace, "wait") == [(100.0, 100.25)] and _nested(trace)


def test_a_full_ring_keeps_the_newest_when_a_time_is_recorded_late(clock: FakeClock) -> None:
    trace = TraceRecorder(2, clock=clock)
    timer = StepTimer(clock=clock, trace=trace)
    for _ in range(2):
        with timer.phase("p"):
            clock.advance(1.0)
    timer.record("old", 0.5, end=100.25)  # older than every event kept: it is the one let go
    timer.record("mid", 0.25, end=101.5)
    assert [e[1] for e in trace.events] == ["mid", "p"] and trace.dropped == 2 and _ends_in_order(trace)


def _filled(clock: FakeClock) -> StepTimer:
    timer = StepTimer(clock=clock)
    with timer.phase("rollout"):
        clock.advance(0.5)
    with timer.wait_on(7, "sample"):
        clock.advance(0.125)
    return timer


def test_to_dict_is_msgpack_able_with_str_keys(clock: FakeClock) -> None:
    data = _filled(clock).to_dict()
    # strict_map_key=True (the default) refuses int keys: all keys must be str
    unpacked = msgpack.unpackb(msgpack.packb(data), strict_map_key=True)
    assert unpacked == data
    assert unpacked["waits"] == {"7": {"sample": 0.125}}
    assert StepTimer.from_dict(unpacked).waits == {7: {"sample": 0.125}}


def test_round_trip_via_json_and_int_keys(clock: FakeClock) -> None:
    timer = _filled(clock)
    again = StepTimer.from_dict(json.loads(json.dumps(timer.to_dict())))
    assert again.to_dict() == timer.to_dict()
    int_keys = dict(timer.to_dict(), waits={7: {"sample": 0.125}})
    assert StepTimer.from_dict(int_keys).waits == timer.waits


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format=99), "format"),
        (lambda d: d.update(extra=1), "unknown keys"),
        (lambda d: d.update(waits={"x": {"a": 1.0}}), "rank key"),
        (lambda d: d.update(phases={"a": "slow"}), "list of seconds"),
        (lambda d: d.update(wait_counts={"1": {"a": -1}}), "wait count"),
    ],
)
def test_from_dict_rejects_malformed(clock: FakeClock, mutate, message: str) -> None:
    data = _filled(clock).to_dict()
    mutate(data)
    with pytest.raises(GflowdistError, match=message):
        StepTimer.from_dict(data)


def test_from_timing_dict_accepts_torchgfn_format() -> None:
    timer = StepTimer.from_timing_dict({"sample": [0.5, 0.25], "total": 3.0})
    assert timer.phases == {"sample": [0.5, 0.25], "total": [3.0]}


def test_throughput_ema(clock: FakeClock) -> None:
    meter = Throughput(alpha=0.5, clock=clock)
    assert meter.rate is None
    clock.advance(1.0)
    assert meter.update(10) == 10.0  # first measurement taken as is
    clock.advance(1.0)
    assert meter.update(20) == 0.5 * 20 + 0.5 * 10
    assert meter.total == 30
    assert meter.mean_rate() == 30 / 2.0


def test_throughput_keeps_items_reported_without_elapsed_time(clock: FakeClock) -> None:
    meter = Throughput(alpha=1.0, clock=clock)
    assert meter.update(5) is None  # no time passed: pending
    clock.advance(0.5)
    assert meter.update(5) == 10 / 0.5  # both reports in the first measurement


def test_throughput_eta_and_validation(clock: FakeClock) -> None:
    meter = Throughput(alpha=1.0, clock=clock)
    assert meter.eta(10) is None
    clock.advance(2.0)
    meter.update(8)  # 4 items/s
    assert meter.eta(20) == 5.0
    with pytest.raises(GflowdistError):
        Throughput(alpha=0.0)
    with pytest.raises(GflowdistError):
        meter.update(-1)


def test_eta_seconds() -> None:
    assert eta_seconds(30, 15.0) == 2.0
    assert eta_seconds(0, None) == 0.0
    assert eta_seconds(5, None) is None
    assert eta_seconds(5, 0.0) is None
    assert eta_seconds(5, math.inf) is None


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "?"),
        (5.04, "5.0s"),
        (65, "1m05s"),
        (3600 + 120 + 3, "1h02m03s"),
        (float("nan"), "?"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
