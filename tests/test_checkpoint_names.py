"""Checkpoint names and the metrics rows a resumed run drops."""

from __future__ import annotations

import json

from gflowdist.runtime.checkpoints import checkpoint_name, step_of, trim_metrics


def test_the_step_of_a_periodic_checkpoint_comes_back_from_its_name():
    assert step_of(checkpoint_name(3, 50)) == 50
    assert step_of(checkpoint_name(0, 0)) == 0
    assert step_of(checkpoint_name(2)) is None


def test_rows_from_the_checkpoint_step_on_are_dropped_and_the_rest_kept_in_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"rank": r, "step": s, "loss": s / 10} for s in (0, 5, 10, 15) for r in (0, 1)] + [
        {"rank": 3, "note": "no step"}
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert trim_metrics(path, 10) == 4
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept == [row for row in rows if row.get("step", -1) < 10 or "step" not in row]
    assert trim_metrics(path, 10) == 0
    assert trim_metrics(tmp_path / "missing.jsonl", 10) == 0
