"""run.tensorboard: scalars written as they arrive and flushed every few seconds, the coordinator's included."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gflowdist.timing.tensorboard_live import LiveBoard


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rows_reach_the_event_files_once_the_flush_interval_passed_before_the_run_ends(tmp_path):
    clock = Clock()
    board = LiveBoard(tmp_path, flush_s=3.0, clock=clock)
    board.add(0, {"step": 0, "loss": 2.0, "trajectories": 8})
    board.add(3, {"step": 0, "eval_return": 9.5})  # the coordinator's own row (Coordinator.record)
    clock.now = 3.5
    board.add(0, {"step": 10, "loss": 1.0, "trajectories": 88, "note": "text is not a scalar"})  # flushes
    assert _scalars(tmp_path / "tensorboard" / "rank-0")["metrics/loss"] == [(0, 2.0), (10, 1.0)]
    assert _scalars(tmp_path / "tensorboard" / "rank-3")["metrics/eval_return"] == [(0, 9.5)]
    board.close()


def test_a_running_job_can_be_followed_in_tensorboard(job_factory):
    job = job_factory("run.steps=100000", "params.delay_s=0.01", "run.tensorboard=true", "run.log_every=5")
    run = job.wait_for_metrics(8)
    folder = run / "tensorboard" / "rank-0"
    deadline = time.monotonic() + 30
    seen: dict = {}

    def followed() -> bool:  # two flushes' worth: the writer may flush when only the first row is in
        return len(seen.get("metrics/loss", [])) >= 2 and "metrics/w_error" in seen

    while time.monotonic() < deadline and not followed():
        if folder.is_dir():
            seen = _scalars(folder)
        time.sleep(0.5)
    assert job.proc.poll() is None, job.output  # still running: the scalars came while it ran
    assert followed(), seen
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(90) == 130, job.output
    assert "metrics/loss" in _scalars(folder)  # the run's end wrote them all again
    assert job.no_process_left()
