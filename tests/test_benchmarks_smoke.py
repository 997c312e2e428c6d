"""Smoke runs of the runtime benchmarks (``--quick``): each prints its table with measured numbers.

No timing is asserted (the machine is shared); the tests check that every
benchmark runs end to end against the real runtime and that its table has a
row per setup with positive rates. The pure helpers are checked on data
whose answer is derived here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.scripts import load_script

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """A benchmark as a module (the benchmarks import each other as siblings)."""
    return load_script(BENCHMARKS / f"{name}.py", f"benchmark_{name}")


def run_quick(name: str, *args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCHMARKS.parent,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout.splitlines()


def row(lines: list[str], first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (cells are separated by 2+ spaces)."""
    import re

    for line in lines:
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n" + "\n".join(lines))


def number(cell: str) -> float:
    return float(cell.split()[0].replace(",", "").rstrip("x%"))


@pytest.mark.slow
def test_hypergrid_quick_prints_both_tables(tmp_path):
    lines = run_quick("hypergrid", "--out-dir", str(tmp_path))
    assert any("load average" in line for line in lines), lines
    bare, one = row(lines, "bare"), row(lines, "1T")
    assert number(bare[2]) > 0 and number(one[2]) > 0  # traj/s
    assert one[1] == "3"  # ranks: 1 trainer + buffer + coordinator
    assert number(one[3]) > 0  # vs bare
    where = [line for line in lines if line.startswith("1T")]
    assert len(where) == 2, lines  # one row in each table
    cells = where[1].split()
    assert float(cells[-1]) > 0  # startup seconds


@pytest.mark.slow
def test_replay_quick_measures_the_buffer_against_raw_transport():
    lines = run_quick("replay")
    cells = row(lines, "small")
    assert cells[1] == "1"
    inserts, raw_inserts, samples, raw_samples = (number(cells[i]) for i in (2, 4, 8, 9))
    assert min(inserts, raw_inserts, samples, raw_samples) > 0
    assert number(cells[12]) > 0 and number(cells[13]) > 0  # round trips


@pytest.mark.slow
def test_startup_quick_times_the_run_and_its_steps(tmp_path):
    lines = run_quick("startup", "--out-dir", str(tmp_path))
    baseline = row(lines, "mpiexec -n 2 python -c 'import torch'")
    first = row(lines, "gflowdist run (4 ranks): launch -> first step done")
    assert number(baseline[1]) > 0 and number(first[1]) > 0
    ranks = row(lines, "rank: import torch")
    assert number(ranks[1]) > 0 and number(ranks[3]) > 0  # wall and CPU


@pytest.mark.slow
def test_replace_quick_times_the_replacement_and_the_routed_path():
    """The real job (5 ranks, the actor killed with kill -9, its spare takes over) and the routes table."""
    lines = run_quick("replace")
    for setup in ("actor-bound", "buffer-bound"):  # each setup's rows follow its heading
        rows = [line.strip() for line in lines[next(i for i, line in enumerate(lines) if line.startswith(setup)) :]]
        first = [line for line in rows if line.startswith("kill -9 to the replacement's first batch")]
        assert first and float(first[0].split()[-3]) > 0, lines
        ratio = [line for line in rows if line.startswith("actor after / before")]
        assert ratio and float(ratio[0].split()[-4]) > 0, lines
    small = row(lines, "416")
    assert min(number(cell) for cell in small[1:]) > 0, small


def test_replace_rates_come_from_cumulative_counts_in_a_window():
    bench = load("replace")
    points = [(10.0, 0), (11.0, 100), (12.0, 300), (20.0, 900)]
    assert bench._rate(points, 10.0, 12.0) == pytest.approx(150.0)  # (300 - 0) / 2 s
    assert bench._rate(points, 11.5, 13.0) != bench._rate(points, 11.5, 13.0)  # one point inside: nan

    rows = bench.Rows(Path("unused"))
    rows.rows = [(10.0, {"rank": 0, "trajectories": 0}), (12.0, {"rank": 0, "trajectories": 40})]
    rows.rows += [(9.0, {"rank": 2, "trajectories": 500}), (10.0, {"rank": 2, "trajectories": 8})]
    rows.rows += [(12.0, {"rank": 2, "trajectories": 48})]
    # the actor's count restarts at 10.0 (its replacement): only its rows from then on count
    assert bench._job_rate(rows, 9.0, 12.0, restart=10.0) == pytest.approx(20.0 + 20.0)


def test_routes_table_gives_the_routed_over_world_ratio_of_each_size():
    routes = load("routes")
    result = {"416": {"world_us": 100.0, "routed_us": 150.0, "world_msgs": 2000.0, "routed_msgs": 1000.0}}
    header, line = routes.table(result)
    assert "routed us/trip" in header
    assert line.split() == ["416", "100.0", "150.0", "1.50x", "2000", "1000", "0.50x"]


def test_time_to_l1_is_the_first_step_where_every_trainer_is_below_the_target():
    bench = load("run_reading")
    rows = [
        {"step": 0, "time": 1.0, "l1": [1.2, 0.4]},
        {"step": 10, "time": 2.0, "l1": [0.5, 0.6]},
        {"step": 20, "time": 3.0, "l1": [0.3, bench.L1_TARGET]},
    ]
    assert bench.time_to_l1(rows) == {"l1_time": 3.0, "l1_step": 20}
    assert bench.time_to_l1(rows[:2]) == {"l1_time": None, "l1_step": None}


def test_read_run_derives_rates_and_waits_from_a_run_directory(tmp_path):
    import json

    bench = load("run_reading")
    metrics = [
        {"rank": 0, "time": 0.5, "step": 0, "trajectories": 16, "l1": 1.0},
        {"rank": 1, "time": 0.6, "step": 0, "trajectories": 16, "l1": 1.1},
        {"rank": 0, "time": 3.9, "step": 9, "trajectories": 160, "l1": 0.4},
        {"rank": 1, "time": 4.0, "step": 9, "trajectories": 160, "l1": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    trainer = {"role": "trainer", "step": 10, "timing": {"phases": {"wait_replay": [0.01] * 10, "loss": [0.3] * 10}}}
    finals = {"0": trainer, "1": trainer, "2": {"role": "buffer", "step": 0, "timing": {"phases": {}}}}
    (tmp_path / "finals.json").write_text(json.dumps(finals))
    got = bench.read_run(tmp_path, trainers=2, steps=10)
    assert got["traj_per_s"] == pytest.approx(320 / 4.0)  # both trainers' trajectories / last line's time
    assert got["step_ms"] == pytest.approx(400.0)
    assert got["wait_ms"] == pytest.approx(10.0)  # 0.1 s of wait_replay over 10 steps
    assert got["wait_pct"] == pytest.approx(2.5)
    assert got["l1_step"] == 9 and got["l1_time"] == 4.0
    assert got["first_step_time"] == 0.5


def test_startup_durations_are_differences_of_consecutive_stamps():
    bench = load("startup")
    marks = [("a", 10.5, 0.2), ("b", 11.0, 0.5), ("c", 13.0, 2.5)]
    assert bench.durations(10.0, marks) == {"a": [0.5, 0.2], "b": [0.5, 0.3], "c": [2.0, 2.0]}


@pytest.mark.slow
def test_all_quick_prints_one_table_of_every_target(tmp_path):
    record = tmp_path / "all.json"
    lines = run_quick("all", "--json", str(record))
    header = next(i for i, line in enumerate(lines) if line.startswith("figure"))
    rows = lines[header + 2 : lines.index("", header)]
    saved = json.loads(record.read_text())
    assert len(rows) == len(saved["rows"]), lines
    figures = [r[0] for r in saved["rows"]]
    for start in (
        "MPIComm round trip",
        "MPIComm bandwidth",
        "compat.torchgfn (MPI) round trip",
        "average_gradients gloo mlp-10 fresh",
        "average_gradients gloo deep-100 views",
        "start-up:",
        "1-step job: launch -> exit",
        "start-up CPU s",
        "HyperGrid traj/s, 2 trainers",
        "HyperGrid traj per CPU s",
        "HyperGrid traj/s vs torchgfn",
    ):
        assert any(f.startswith(start) for f in figures), (start, figures)
    for figure, baseline, _ours, ratio, target, holds in saved["rows"]:
        if baseline == "skipped":
            assert holds == "-" and "--quick" in ratio
            continue
        value = number(ratio)
        if target == "-":  # a figure shown for what it explains (CPU seconds), no target of its own
            assert value > 0 and holds == "-", (figure, ratio, holds)
            continue
        limit = float(target.split()[1])
        assert value > 0 and holds == (
            "yes" if (value <= limit if target.startswith("<=") else value >= limit) else "NO"
        ), (figure, ratio, target, holds)
    assert "load average" in lines[0] and "load average" in lines[-1], lines


def test_a_ratio_is_shown_with_the_digits_that_agree_with_its_verdict():
    """A miss that rounds onto its target (0.898 against >= 0.90) is shown as the miss it is; the verdict is
    judged on the unrounded ratio."""
    table = load("all").Table()
    table.add("miss by a hair", "1 s", "1 s", 0.898, ">= 0.90", 0.93)
    table.add("miss closer still", "1 s", "1 s", 0.89999, ">= 0.90")
    table.add("hit", "1 s", "1 s", 1.234, "<= 1.30")
    table.add("on the target", "1 s", "1 s", 1.3, "<= 1.30")
    table.add("no target", "1 s", "1 s", 0.5)
    got = [(r[0], r[3], r[5]) for r in table.rows]
    assert got == [
        ("miss by a hair", "0.898 (0.93)", "NO"),
        ("miss closer still", "0.89999", "NO"),
        ("hit", "1.23", "yes"),
        ("on the target", "1.30", "yes"),
        ("no target", "0.50", "-"),
    ]


def test_transport_quick_measures_a_users_echo_loop_against_both_raw_baselines(tmp_path):
    lines = run_quick("transport", "--engines", "mpi", "--json", str(tmp_path / "transport.json"))
    rows = json.loads((tmp_path / "transport.json").read_text())["mpi"]
    assert [r["size"] for r in rows] == load("transport").QUICK
    for r in rows:
        assert min(r["raw"], r["raw_huge"], r["comm"], r["compat"]) > 0, r
        assert r["comm_huge_ratio"] > 0 and r["compat_ratio"] > 0, r
    assert any(line.startswith("raw: a preallocated NumPy buffer; raw huge:") for line in lines), lines


def test_crowded_reduce_quick_times_both_all_reduces_on_both_engines(tmp_path):
    """Each engine's table has a row per size and case with both communicators' times; the worker itself
    fails if the shared one did not open a mapping."""
    out = tmp_path / "crowded.json"
    lines = run_quick("crowded_reduce", "--sizes", "100", "--calls", "40", "--json", str(out))
    assert sum("crowded ranks, all_reduce" in line for line in lines) == 2, lines
    measured = json.loads(out.read_text())
    for engine in ("mpi", "torch"):
        assert [(r["n"], r["work"]) for r in measured[engine]] == [(100, False), (100, True)]
        for r in measured[engine]:
            assert all(r[name]["wall"] > 0 and r[name]["cpu"] >= 0 for name in ("engine", "shared"))
