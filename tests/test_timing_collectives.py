"""Collective waits (last arriver, waits on it) in the report, and trace.json built from rank traces."""

from __future__ import annotations

import json

import pytest

from gflowdist.runtime.wiring import StopFlag
from gflowdist.timing import StepTimer, build_report
from gflowdist.timing.collectives import collective_waits
from gflowdist.timing.trace import INSTANT, SENT, TOOK, TraceRecorder
from gflowdist.timing.trace_file import chrome_trace, write_trace


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _timed_collectives(durations: list[float], clock: FakeClock, timer: StepTimer, group=(0, 1, 2)) -> None:
    for d in durations:
        with timer.collective("gradients", group):
            clock.now += d


def _three_ranks(trace: bool = False) -> tuple[dict[int, StepTimer], dict[int, TraceRecorder]]:
    """Rank 2 arrives last at collectives 0 and 2 (shortest time), rank 0 at collective 1."""
    seconds = {0: [0.5, 0.1, 0.7], 1: [0.3, 0.4, 0.6], 2: [0.1, 0.2, 0.2]}
    timers, traces = {}, {}
    for rank, durations in seconds.items():
        clock = FakeClock()
        traces[rank] = TraceRecorder(100, clock=clock)
        timers[rank] = StepTimer(clock=clock, trace=traces[rank] if trace else None)
        _timed_collectives(durations, clock, timers[rank])
    return timers, traces


def test_last_arriver_and_waits_on_it() -> None:
    timers, _ = _three_ranks()
    (c,) = collective_waits(timers)
    assert (c.name, c.group, c.count) == ("gradients", (0, 1, 2), 3)
    assert c.last == {2: 2, 0: 1} and c.straggler == 2
    assert c.waited[0][2] == pytest.approx((0.5 - 0.1) + (0.7 - 0.2))
    assert c.waited[1][2] == pytest.approx((0.3 - 0.1) + (0.6 - 0.2))
    assert c.waited[1][0] == pytest.approx(0.4 - 0.1) and c.waited[2][0] == pytest.approx(0.2 - 0.1)
    assert 2 not in c.waited.get(2, {})


def test_report_puts_collective_waits_in_matrix_stragglers_and_json() -> None:
    timers, _ = _three_ranks()
    report = build_report(
        {r: t.to_dict() for r, t in timers.items()},
        roles={0: "trainer", 1: "trainer", 2: "trainer"},
        hosts={2: "node-b"},
    )
    assert report.waits.by_label[0][2]["collective:gradients"] == pytest.approx(0.9)
    assert report.waits.waited_on(2) == pytest.approx(0.9 + 0.6)
    # one wait per collective the peer arrived last at (rank 2 at two of the three, rank 0 at one), not 1 per group
    counts = {
        w: {p: labels["collective:gradients"] for p, labels in peers.items()}
        for w, peers in report.waits.counts.items()
    }
    assert counts == {0: {2: 2}, 1: {2: 2, 0: 1}, 2: {0: 1}}
    text = report.to_text()
    assert "collective gradients of ranks 0-2: rank 2 on node-b arrived last at 2 of 3" in text
    data = json.loads(report.to_json())
    (entry,) = data["collectives"]
    assert entry["straggler"] == 2 and entry["last"] == {"2": 2, "0": 1}
    assert data["waits"]["counts"]["1"] == {"2": {"collective:gradients": 2}, "0": {"collective:gradients": 1}}
    again = type(report).from_json(report.to_json())
    assert again.to_text() == text


def test_a_member_without_seconds_is_noted_not_guessed() -> None:
    timers, _ = _three_ranks()
    del timers[1]
    report = build_report({r: t.to_dict() for r, t in timers.items()}, roles={0: "trainer", 2: "trainer"})
    assert report.collectives[0].count == 0 and report.collectives[0].missing == (1,)
    assert any("no seconds from rank(s) 1" in note for note in report.notes)
    assert not report.waits.by_label


def test_trace_has_a_track_per_rank_paired_flows_and_named_last_arrivers(tmp_path) -> None:
    timers, traces = _three_ranks(trace=True)
    traces[0].message(SENT, "TRAJECTORIES", 2, 1, 0, 1.0, 0.01)
    traces[2].message(TOOK, "TRAJECTORIES", 0, 1, 0, 0.5, 0.7)  # a blocking take, begun before the send
    traces[0].message(SENT, "TRAJECTORIES", 2, 1, 1, 2.0, 0.01)  # never taken: no arrow
    traces[1].instant("checkpoint gen-0000-step-000000002", "checkpoint")
    trace = chrome_trace(
        {r: t.to_dict() for r, t in traces.items()},
        names={r: f"rank {r} trainer @h" for r in traces},
        timings={r: t.to_dict() for r, t in timers.items()},
    )
    path = write_trace(tmp_path / "trace.json", trace)
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 trainer @h", 1: "rank 1 trainer @h", 2: "rank 2 trainer @h"}
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 1 and starts[0]["id"] == ends[0]["id"]
    assert (starts[0]["pid"], ends[0]["pid"]) == (0, 2)
    send, take = (next(e for e in events if e["ph"] == "X" and e["pid"] == p and e["cat"] == "message") for p in (0, 2))
    assert send["ts"] < starts[0]["ts"] < ends[0]["ts"] < take["ts"] + take["dur"]  # send's start -> take's end
    assert ends[0]["ts"] == pytest.approx(take["ts"] + take["dur"], abs=0.2)
    collectives = [e for e in events if e.get("cat") == "collective"]
    assert len(collectives) == 9
    first_on_0 = next(e for e in collectives if e["pid"] == 0 and e["args"]["index"] == 0)
    assert first_on_0["args"]["last_arriver"] == 2
    assert first_on_0["args"]["waited_on_last_s"] == pytest.approx(0.4)
    assert any(e["ph"] == "i" and e["pid"] == 1 for e in events)


def test_a_stop_is_an_instant_on_the_trace_once() -> None:
    clock = FakeClock()
    stop, stop.trace = StopFlag(), TraceRecorder(10, clock=clock)
    clock.now = 2.5
    stop.set("signal SIGTERM")
    stop.set("the coordinator decided to stop")  # the first reason stays: no second instant
    assert [list(e) for e in stop.trace.events] == [[INSTANT, "stop", "stop", 2.5, {"reason": "signal SIGTERM"}]]
    assert stop.reason == "signal SIGTERM"


def test_ring_keeps_the_newest_and_the_trace_keeps_the_common_window() -> None:
    clock = FakeClock()
    small = TraceRecorder(3, clock=clock)
    for i in range(5):
        small.span(f"p{i}", "phase", float(i), 0.5)
    assert small.dropped == 2 and [e[1] for e in small.events] == ["p2", "p3", "p4"]
    full = TraceRecorder(10, clock=clock)
    for i in range(5):
        full.span(f"q{i}", "phase", float(i), 0.5)
    trace = chrome_trace({0: small.to_dict(), 1: full.to_dict()}, names={})
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sorted(e["name"] for e in spans if e["pid"] == 1) == ["q2", "q3", "q4"]
    assert min(e["ts"] for e in spans) == 0.0 and trace["otherData"]["dropped"] == {"0": 2, "1": 0}


def test_events_that_touch_on_the_clock_touch_in_the_file() -> None:
    """The coordinator's idle stretch ends where the turn it records in (``collect``) begins: in trace.json the
    first ends exactly where the second starts (ts + dur, as a viewer adds them), not a rounding step later."""
    clock = FakeClock()
    trace = TraceRecorder(10, clock=clock)
    timer = StepTimer(clock=clock, trace=trace)
    clock.now = 1000.0
    with timer.phase("start"):  # the trace's origin
        pass
    began = 1041.8230726 + 0.0238177  # a turn began: the idle stretch of 0.0238177 s before it ended there
    clock.now = began + 0.0125
    timer.record("idle", 0.0238177, end=began)
    timer.record("collect", clock.now - began, end=clock.now)
    events = {e["name"]: e for e in chrome_trace({0: trace.to_dict()}, names={})["traceEvents"] if e["ph"] == "X"}
    idle, collect = events["idle"], events["collect"]
    assert idle["ts"] + idle["dur"] == collect["ts"] == pytest.approx(41846890.3)
    assert collect["ts"] + collect["dur"] == pytest.approx(41859390.3)
