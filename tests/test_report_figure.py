"""report.png true to its key: idle hatched, the key beside the bars, every rank in the heatmap, chosen curves."""

from __future__ import annotations

import dataclasses

import pytest

from gflowdist.timing import build_report
from gflowdist.timing.curves import base_name, chosen_curves, curve_order, curves_by_step
from gflowdist.timing.figure import curve_panels, draw_figure

pytest.importorskip("matplotlib")

ROLES = {0: "trainer", 1: "actor", 2: "buffer", 3: "coordinator"}
ROWS = [  # metrics.jsonl of an Ape-X run: the learner, an actor, the coordinator's evaluations
    {"rank": 0, "step": 0, "loss": 1.5, "trajectories": 0},
    {"rank": 1, "step": 0, "trajectories": 1600, "env_steps": 1600, "episode_return": 10.5},
    {"rank": 0, "step": 50, "loss": 0.5, "trajectories": 0},
    {"rank": 1, "step": 40, "trajectories": 3200, "env_steps": 3200, "episode_return": 30.0},
    {"rank": 3, "step": 50, "eval_return": 120.0},
]


def _timer(phases: dict[str, list[float]], waits: dict[str, dict[str, float]] | None = None) -> dict:
    return {"format": 1, "phases": phases, "waits": waits or {}, "wait_counts": {}}


def _report(**kw):
    return build_report(
        {
            0: _timer({"loss": [1.0, 1.0], "wait_replay": [0.5, 0.5]}, {"2": {"replay": 1.0}}),
            1: _timer({"rollout": [2.0], "idle": [3.0]}),
            2: _timer({"idle": [4.0], "insert": [0.5]}),
            3: _timer({"idle": [5.0], "collect": [0.1]}),
        },
        roles=ROLES,
        metrics=curves_by_step(ROWS, ROLES),
        **kw,
    )


def _bars(report):
    """{(role, phase): (busy part's hatches, idle part's hatches)} of the figure's bars."""
    ax = draw_figure(report).axes[0]
    segments = [(role, p.phase) for role, phases in report.imbalance.items() for p in phases]
    return {
        seg: ({b.get_hatch() for b in ax.containers[2 * i]}, {b.get_hatch() for b in ax.containers[2 * i + 1]})
        for i, seg in enumerate(segments)
    }


def test_idle_phases_are_hatched_as_the_key_says_and_working_phases_solid():
    bars = _bars(_report())
    for idle in (("buffer", "idle"), ("coordinator", "idle"), ("actor", "idle"), ("trainer", "wait_replay")):
        assert bars[idle][0] == {"///"}, idle  # drawn solid, the figure's own key called them busy
    for working in (("buffer", "insert"), ("coordinator", "collect"), ("actor", "rollout"), ("trainer", "loss")):
        assert bars[working] == ({None}, {"///"}), working  # waiting for the slowest rank is hatched too


def test_the_key_is_beside_the_bars_not_on_them():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = draw_figure(_report())
    FigureCanvasAgg(fig).draw()
    bars, key = fig.axes[0], fig.axes[1]
    legend = key.get_legend()
    assert bars.get_legend() is None and legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:2] == ["solid: working", "hatched: idle, waiting"] and "coordinator/idle" in labels
    assert not legend.get_window_extent().overlaps(bars.get_window_extent())


def test_the_heatmap_shows_every_rank_with_its_role():
    fig = draw_figure(_report())
    heat = fig.axes[2]
    expected = ["0 trainer", "1 actor", "2 buffer", "3 coordinator"]  # only rank 0 ever waited
    assert [t.get_text() for t in heat.get_yticklabels()] == expected
    assert [t.get_text() for t in heat.get_xticklabels()] == expected


def test_a_metric_several_roles_report_is_a_line_per_role_not_a_sawtooth():
    curves = _report().curves
    assert "trajectories" not in curves
    assert curves["trajectories (trainer)"]["y"] == [0, 0] and curves["trajectories (actor)"]["y"] == [1600, 3200]
    assert base_name("trajectories (actor)") == "trajectories" and base_name("loss") == "loss"


def test_by_default_the_coordinators_metrics_come_first_and_counts_last():
    order = curve_order(ROWS, ROLES)
    assert order == [
        "eval_return",
        "loss",
        "episode_return",
        "trajectories (trainer)",
        "trajectories (actor)",
        "env_steps",
    ]
    report = dataclasses.replace(_report(), curves={k: _report().curves[k] for k in order})
    assert [name for name, _ in curve_panels(report)] == ["eval_return", "loss", "episode_return", "trajectories"]
    panel = dict(curve_panels(report))["trajectories"]
    assert panel == ["trajectories (trainer)", "trajectories (actor)"]
    lines = draw_figure(report).axes[-1].get_lines()
    assert [line.get_label() for line in lines] == ["trainer", "actor"]


def test_report_curves_chooses_the_panels_and_names_what_matches_nothing():
    available = curve_order(ROWS, ROLES)
    drawn, unknown = chosen_curves(available, ["episode_return", "trajectories", "eval_retrun"])
    assert drawn == ["episode_return", "trajectories (trainer)", "trajectories (actor)"]
    assert unknown == ["eval_retrun"]
    report = dataclasses.replace(_report(), shown_curves=tuple(drawn))
    assert [name for name, _ in curve_panels(report)] == ["episode_return", "trajectories"]
    assert [ax.get_title() for ax in draw_figure(report).axes[4:]] == ["episode_return", "trajectories"]
