"""The progress line: the ETA, the rate of this generation, the unit, in place in a terminal, flooding."""

from __future__ import annotations

import io

import pytest

from gflowdist.config import Config
from gflowdist.jobenv import CONSOLE_VARIABLE
from gflowdist.runtime.progress import FLOOD_FACTOR, ProgressLine, console_of, flood, producer_class, progress_line
from tests.support.wirings import wirings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _line(clock: Clock, out: io.StringIO | None = None, **kw) -> ProgressLine:
    args = dict(
        total_steps=2000,
        start_step=0,
        generation=0,
        unit="trajectories",
        trainers=[0, 1],
        actors=[],
        replayed_per_step=lambda fresh: 4.0,
        pace_setting="params.env_steps_per_update",
        clock=clock,
        console=(False, 100),
    )
    args.update(kw)
    return ProgressLine(out or io.StringIO(), **args)


def _fields(text: str) -> dict[str, str]:
    words = text.replace("\r\x1b[2K", " ").split()
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}


def test_the_eta_is_the_remaining_steps_at_this_runs_pace_whatever_metrics_come():
    """The bug: a metric loop reused the name of run.steps, so the ETA read 0.0s on every line."""
    clock = Clock()
    line = _line(clock)
    clock.now += 10.0  # 500 of 2000 steps in 10 s: 1500 steps to go take 30 s
    latest = {
        0: {"step": 499, "loss": 0.5, "trajectories": 8000, "episodes": 3},
        1: {"step": 510, "loss": 0.25, "trajectories": 8100, "episodes": 4},
    }
    fields = line.fields(latest, {})
    assert fields["step"] == "500/2000"
    assert fields["eta"] == "30.0s"
    assert (fields["loss"], fields["episodes"]) == ("0.375", "7")


def test_the_eta_is_unknown_until_a_step_of_this_run_is_done():
    clock = Clock()
    line = _line(clock, start_step=300, generation=1)
    clock.now += 5.0
    assert line.fields({0: {"step": 299, "trajectories": 0}}, {})["eta"] == "?"


def test_after_a_resume_the_rate_and_eta_are_this_generations():
    """A resumed run counted every trajectory since the start over the time since the resume (124,371/s)."""
    clock = Clock()
    line = _line(clock, start_step=1000, generation=1)
    line.heard(0, 100_000)  # the first heartbeats: what each rank had produced before the resume
    line.heard(1, 120_000)
    clock.now += 10.0
    fields = line.fields({0: {"step": 1199, "trajectories": 103_000}, 1: {"step": 1249, "trajectories": 122_000}}, {})
    assert fields["gen"] == "1"
    assert fields["trajectories/s"] == "500"  # 5,000 made in 10 s, not 225,000
    assert fields["eta"] == "40.0s"  # 200 steps in 10 s; 800 to go


def test_a_fresh_run_counts_from_zero_even_if_its_first_count_arrives_late():
    clock = Clock()
    line = _line(clock)
    clock.now += 4.0
    fields = line.fields({0: {"step": 9, "trajectories": 160}, 1: {"step": 9, "trajectories": 160}}, {})
    assert fields["trajectories/s"] == "80"


def test_the_rate_is_named_for_the_unit_the_producing_class_makes():
    pytest.importorskip("gymnasium")

    config = Config.from_yaml("examples/apex_cartpole/config.yaml")
    w = wirings(config, 5)[0]  # the example's 5 ranks, as threads
    line = progress_line(w, io.StringIO(), producer=producer_class(config, w.context.layout))
    assert line.unit == "transitions"
    assert line.pace_setting == "params.env_steps_per_update"
    hypergrid = Config.from_yaml("examples/hypergrid/config.yaml")
    w = wirings(hypergrid, 4)[0]
    assert progress_line(w, io.StringIO(), producer=producer_class(hypergrid, w.context.layout)).unit == "trajectories"


def test_in_a_terminal_one_line_is_rewritten_in_place_and_ended_once():
    clock, out = Clock(), io.StringIO()
    line = _line(clock, out, console=(True, 40))
    for step in (10, 20, 30):
        clock.now += 1.0
        assert line.due()
        line.write(line.fields({0: {"step": step, "loss": 0.123456789, "trajectories": 0}}, {"modes": "4/4"}))
    text = out.getvalue()
    assert "\n" not in text
    assert text.count("\r\x1b[2K") == 3
    assert all(len(piece) <= 39 for piece in text.split("\r\x1b[2K"))  # cut to the terminal's width
    line.finish()
    line.finish()
    assert out.getvalue().count("\n") == 1


def test_through_a_pipe_a_line_every_five_seconds():
    clock, out = Clock(), io.StringIO()
    line = _line(clock, out)
    assert line.due()
    clock.now += 1.0
    assert not line.due()
    clock.now += 4.5
    assert line.due()
    line.write({"step": "1/2"})
    line.finish()
    assert out.getvalue() == "step 1/2\n"


def test_the_console_is_what_the_launcher_says_when_the_ranks_stdout_is_a_pipe(monkeypatch):
    monkeypatch.setenv(CONSOLE_VARIABLE, "tty:132")
    assert console_of(io.StringIO()) == (True, 132)
    monkeypatch.setenv(CONSOLE_VARIABLE, "pipe")
    assert console_of(io.StringIO())[0] is False
    monkeypatch.delenv(CONSOLE_VARIABLE)
    assert console_of(io.StringIO())[0] is False


def test_actors_flooding_the_learners_are_named_with_the_setting_that_paces_them():
    """43,616 of 44,320 trajectories in 21 trainer steps, and nothing said so."""
    clock = Clock()
    line = _line(
        clock,
        trainers=[0],
        actors=[1, 2],
        replayed_per_step=lambda fresh: 64.0 if fresh is None else 4.0,
        unused_items=1000,
        pace_setting="params.env_steps_per_update",
        unit="transitions",
    )
    clock.now += 10.0
    latest = {
        0: {"step": 20, "trajectories": 0},
        1: {"step": 3, "trajectories": 22000},
        2: {"step": 3, "trajectories": 22000},
    }
    fields = line.fields(latest, {})
    assert fields["flooding"].startswith("32x")  # (44,000 - 1,000) / 21 = 2,048 per step against 64
    assert "params.env_steps_per_update" in " ".join(fields.values())
    note = line.last_flood.note()
    assert "2048 transitions admitted per learner step, 64 replayed per step (32x)" in note
    assert note.endswith("pace them with params.env_steps_per_update")


def test_paced_actors_and_trainers_own_rollouts_are_not_flooding():
    clock = Clock()
    line = _line(clock, trainers=[0], actors=[1], replayed_per_step=lambda fresh: 64.0, unused_items=1000)
    clock.now += 10.0
    fields = line.fields({0: {"step": 99, "trajectories": 0}, 1: {"step": 90, "trajectories": 2600}}, {})
    assert "flooding" not in fields  # 16 per step against 64 replayed
    trainers_only = _line(clock, trainers=[0, 1], replayed_per_step=lambda fresh: 4.0)
    clock.now += 10.0
    assert "flooding" not in trainers_only.fields({0: {"step": 99, "trajectories": 10**6}}, {})


def test_flood_is_judged_only_after_a_few_steps_and_at_the_factor():
    assert flood(10_000, 2, 1.0, unit="t", setting="s") is None  # the first steps wait for min_size_to_sample
    assert flood(FLOOD_FACTOR * 64 * 10 - 1, 10, 64, unit="t", setting="s") is None
    assert flood(FLOOD_FACTOR * 64 * 10, 10, 64, unit="t", setting="s") is not None


def test_actors_without_metrics_rows_count_through_their_heartbeats():
    """An actor whose metrics() is empty sends no rows; its heartbeats carry its count (the rate read 336, not 833)."""
    clock = Clock()
    line = _line(clock, trainers=[0], actors=[1])
    line.heard(1, 0)
    clock.now += 10.0
    line.heard(1, 6000)  # a heartbeat
    fields = line.fields({0: {"step": 99, "trajectories": 1600}}, {})
    assert fields["trajectories/s"] == "760"
