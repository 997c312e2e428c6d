"""report.png: drawn with matplotlib (a dependency) into every run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from gflowdist.timing import StepTimer, build_report
from gflowdist.timing.figure import figure_unavailable_reason, save_figure

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _timer(phases: dict[str, list[float]], peer: int, seconds: float) -> dict:
    timer = StepTimer.from_timing_dict(phases)
    timer.record_wait(peer, "sample", seconds)
    return timer.to_dict()


def test_save_writes_png_with_all_panels(tmp_path: Path) -> None:
    per_rank = {0: _timer({"rollout": [1.0, 2.0], "train": [0.5]}, 2, 0.5),
                1: _timer({"rollout": [3.0, 1.0]}, 2, 1.5),
                2: _timer({"serve": [0.1]}, 0, 0.25)}
    metrics = [{"step": i, "loss": 1.0 / (i + 1), "modes": i, "kl": float("nan") if i == 2 else i,
                "reward": 2 * i, "extra": 1} for i in range(5)]
    report = build_report(per_rank, roles={0: "trainer", 1: "trainer", 2: "buffer"},
                          metrics=metrics)
    assert figure_unavailable_reason() is None
    saved = report.save(tmp_path)
    assert saved.png_skipped is None
    png = tmp_path / "report.png"
    assert png in saved.paths and png.read_bytes()[:8] == PNG_MAGIC


def test_figure_of_an_empty_report(tmp_path: Path) -> None:
    out = save_figure(build_report({}, roles={}), tmp_path / "empty.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
