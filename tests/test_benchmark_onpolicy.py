"""benchmarks/onpolicy.py: its lag histogram and table on data whose answer is derived here; a quick run (slow)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load():
    return load_script(BENCHMARKS / "onpolicy.py", "benchmark_onpolicy")


def test_lag_histogram_counts_fresh_items_at_zero_and_replayed_ones_by_staleness():
    finals = {
        "0": {"role": "trainer", "ledger": {"used_locally": 100}, "staleness": {"1": 5, "3": 2}},
        "1": {"role": "trainer", "ledger": {"used_locally": 50}, "staleness": {}},
        "2": {"role": "buffer", "ledger": {"used_locally": 7}, "staleness": {"9": 9}},
    }
    assert load().lag_histogram(finals) == {0: 150, 1: 5, 3: 2}


def run(steps, seconds, solved=True, lag=None):
    point = {"seconds": seconds, "env_steps": steps, "eval_return": 500.0}
    return {"wall_s": seconds + 5, "curve": [point], "solved_at": point if solved else None, "lag": lag or {}}


def test_table_gives_the_env_step_ratio_against_the_single_process_and_its_verdict():
    bench = load()
    results = {
        "PPO CartPole": {
            "single process": [run(1000, 10.0), run(2000, 20.0), run(3000, 30.0)],
            "gflowdist": [run(2400, 8.0, lag={0: 10}), run(2600, 9.0), run(9000, 50.0, solved=False)],
        },
        "PPO Pendulum": {"single process": [run(1000, 10.0)], "gflowdist": [run(1400, 10.0, lag={0: 3, 2: 1})]},
    }
    lines = bench.table(results, {"PPO CartPole": 475.0, "PPO Pendulum": -250.0})
    text = "\n".join(lines)
    assert "1.25x ok" in text  # median 2,500 of the solved runs / median 2,000
    assert "1.40x NO" in text  # 1,400 / 1,000 is over 1.3
    assert "2/3" in text and "0:10" in text and "0:3 2:1" in text
    assert "2,500 (2,400-2,600)" in text  # the unsolved run is left out


@pytest.mark.slow
def test_quick_run_prints_a_row_per_example_and_variant(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "onpolicy.py"),
            "--quick",
            "--examples",
            "PPO CartPole",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=BENCHMARKS.parent,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("PPO CartPole")]
    assert len(rows) == 2 and "load average" in out.stdout
    assert "0:4,096" in rows[1]  # 4 updates x 2 trainers x 4 envs x 128 steps, each learned at lag 0
