"""report.png: drawn with matplotlib (a dependency) into every run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gflowdist.config import Config
from gflowdist.config.figure_choice import FIGURE_VARIABLE, figure_wanted
from gflowdist.errors import ConfigError
from gflowdist.timing import StepTimer, build_report
from gflowdist.timing.figure import figure_unavailable_reason, save_figure
from gflowdist.timing.trace_figure import WindowError, draw_timeline, trace_span_ms

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _timer(phases: dict[str, list[float]], peer: int, seconds: float) -> dict:
    timer = StepTimer.from_timing_dict(phases)
    timer.record_wait(peer, "sample", seconds)
    return timer.to_dict()


def test_save_writes_png_with_all_panels(tmp_path: Path) -> None:
    per_rank = {
        0: _timer({"rollout": [1.0, 2.0], "train": [0.5]}, 2, 0.5),
        1: _timer({"rollout": [3.0, 1.0]}, 2, 1.5),
        2: _timer({"serve": [0.1]}, 0, 0.25),
    }
    metrics = [
        {"step": i, "loss": 1.0 / (i + 1), "modes": i, "kl": float("nan") if i == 2 else i, "reward": 2 * i, "extra": 1}
        for i in range(5)
    ]
    report = build_report(per_rank, roles={0: "trainer", 1: "trainer", 2: "buffer"}, metrics=metrics)
    assert figure_unavailable_reason() is None
    saved = report.save(tmp_path)
    assert saved.png_skipped is None
    png = tmp_path / "report.png"
    assert png in saved.paths and png.read_bytes()[:8] == PNG_MAGIC


def test_figure_of_an_empty_report(tmp_path: Path) -> None:
    out = save_figure(build_report({}, roles={}), tmp_path / "empty.png")
    assert out.read_bytes()[:8] == PNG_MAGIC


def _small_trace() -> dict:
    """Two tracks: a phase on rank 0 from 1 to 3 ms, a message on rank 1 from 10 to 11 ms, an instant at 20 ms."""
    meta = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} trainer @h"}} for r in (0, 1)]
    return {
        "traceEvents": [
            *meta,
            {"ph": "X", "name": "rollout", "cat": "phase", "pid": 0, "tid": 0, "ts": 1000.0, "dur": 2000.0, "args": {}},
            {
                "ph": "X",
                "name": "take X <- 0",
                "cat": "message",
                "pid": 1,
                "tid": 0,
                "ts": 10000.0,
                "dur": 1000.0,
                "args": {},
            },
            {
                "ph": "i",
                "s": "t",
                "name": "checkpoint",
                "cat": "checkpoint",
                "pid": 1,
                "tid": 0,
                "ts": 20000.0,
                "args": {},
            },
        ]
    }


def test_timeline_of_a_stretch_without_phases_and_a_window_outside_the_trace(tmp_path: Path) -> None:
    trace = _small_trace()
    assert trace_span_ms(trace) == (1.0, 20.0)
    # only a message and an instant in the window: no legend entries (matplotlib refuses ncol=0), still a picture
    out = draw_timeline(trace, tmp_path / "gap.png", window_ms=(9.0, 25.0))
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(WindowError, match=r"window 99999:100100 ms is outside the trace, which spans 1\.0 to 20\.0 ms"):
        draw_timeline(trace, tmp_path / "outside.png", window_ms=(99999.0, 100100.0))
    assert not (tmp_path / "outside.png").exists()


def test_report_figure_decides_and_null_asks_the_environment() -> None:
    for env in ({}, {FIGURE_VARIABLE: "0"}, {FIGURE_VARIABLE: "1"}):
        assert figure_wanted(True, env) is True and figure_wanted(False, env) is False  # the key wins
    assert figure_wanted(None, {}) is True  # the default: draw
    assert figure_wanted(None, {FIGURE_VARIABLE: "0"}) is False
    assert figure_wanted(None, {FIGURE_VARIABLE: "1"}) is True
    with pytest.raises(ConfigError, match=f"environment: {FIGURE_VARIABLE}: expected 0 or 1 .*found 'yes'"):
        figure_wanted(None, {FIGURE_VARIABLE: "yes"})
    assert Config().report.figure is None
    assert Config().apply_overrides(["report.figure=false"]).report.figure is False
    with pytest.raises(ConfigError, match=r"report\.figure"):
        Config().apply_overrides(["report.figure=2"])


def test_without_the_figure_a_report_writes_its_text_and_json_only(tmp_path: Path) -> None:
    report = build_report({0: _timer({"rollout": [1.0]}, 1, 0.5)}, roles={0: "trainer"}, metrics=[])
    (tmp_path / "report.png").write_bytes(PNG_MAGIC)  # left by an attempt that drew one: not this report's
    saved = report.save(tmp_path, figure=False)
    assert saved.png_skipped == "report.figure is false"
    assert sorted(p.name for p in saved.paths) == ["report.json", "report.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.txt"]


def test_gflowdist_run_refuses_a_bad_variable_before_it_launches(monkeypatch) -> None:
    from gflowdist.cli import preflight

    monkeypatch.setenv(FIGURE_VARIABLE, "true")
    with pytest.raises(ConfigError, match=f"{FIGURE_VARIABLE}: expected 0 or 1"):
        preflight.check_extras(Config())
    preflight.check_extras(Config().apply_overrides(["report.figure=true"]))  # the key answers: not asked
