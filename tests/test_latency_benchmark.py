"""benchmarks/latency.py: the smoke run (scaled down, no peer) end to end, and its pure helpers.

No timing is asserted (the machine is shared): the smoke run checks that
every path runs against the real runtime (a single process and Ape-X with
2 actors, 5 real ranks, at 2 ms per environment step; the same for IMPALA; bare HyperGrid and 1 trainer
+ 1 actor with a 10 ms oracle) and that the last line has the form a
script reads. The helpers are checked on rows whose answer is derived here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.test_benchmarks_smoke import BENCHMARKS, load

LAST_LINE = re.compile(
    r"^latency: actors4 (?P<a4>\S+) actors8 (?P<a8>\S+) time_to_target (?P<t>\S+) oracle (?P<o>\S+) "
    r"inference (?P<i>\S+) rllib (?P<r>\S+)$"
)


@pytest.mark.slow  # 35 s of real ranks idle, minutes under load; `pytest -m slow` runs it
def test_smoke_run_prints_both_tables_and_the_summary_line(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "latency.py"),
            "--smoke",
            "--actors",
            "2",
            "--target-actors",
            "2",
            "--impala-actors",
            "2",
            "--gfn-actors",
            "1",
            "--inference-actors",
            "2",
            "--inference-hidden",
            "256,128",
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=480,
        cwd=BENCHMARKS.parent,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    assert match["a4"] == match["a8"] == "-"  # not measured in the smoke run
    assert match["r"] == "not-run" and "rllib: not run: left out (--no-peer)" in lines
    assert match["i"].endswith("x") and float(match["i"][:-1]) > 0  # the inference column was measured
    inference_rows = (
        "own forward 2A 3x256",
        "inference 1A+1I split 1 3x256",
        "inference 1A+1I split 2 3x256",
        "own forward 2A 3x128",  # the second width: own forward and the default split only
        "inference 1A+1I split 1 3x128",
    )
    for name in inference_rows:
        row = next(line for line in lines if line.startswith(name + "  "))
        assert float(row[len(name) :].split()[1].replace(",", "")) > 0, row  # env steps/s
        assert float(row[len(name) :].split()[2].rstrip("x")) > 0, row  # vs own forward of the same width
    assert not any(line.startswith("inference 1A+1I split 2 3x128") for line in lines)
    for name in ("single process", "Ape-X 2", "single process (IMPALA)", "IMPALA 2", "bare", "1T + 1A"):
        row = next(line for line in lines if line.startswith(name + "  "))
        assert float(row[len(name) :].split()[0].replace(",", "")) > 0, row  # env steps/s or ranks
    ape2 = next(line for line in lines if line.startswith("Ape-X 2  "))
    assert float(ape2.split()[3].rstrip("x")) > 0  # vs single
    impala2 = next(line for line in lines if line.startswith("IMPALA 2  "))
    assert float(impala2.split()[3].rstrip("x")) > 0  # vs the IMPALA single process
    assert any(line.startswith("  IMPALA 2: actor ") for line in lines)  # where its time goes
    assert "load average" in lines[0] and any("load average" in line for line in lines[-3:])


def test_summed_rate_adds_each_ranks_own_rate():
    bench = load("latency")
    rows = [
        {"rank": 1, "time": 1.0, "env_steps": 100},
        {"rank": 2, "time": 2.0, "env_steps": 0},
        {"rank": 1, "time": 3.0, "env_steps": 500},  # 400 in 2 s
        {"rank": 2, "time": 6.0, "env_steps": 400},  # 400 in 4 s
        {"rank": 3, "time": 6.0, "env_steps": 900},  # one row: no rate
        {"rank": 0, "time": 1.0, "loss": 1.0},
    ]
    assert bench.summed_rate(rows, {1, 2, 3}, "env_steps") == 200 + 100


def test_time_to_l1_waits_for_every_actor_below_the_target():
    bench = load("latency")
    rows = [
        {"rank": 1, "time": 1.0, "l1": 0.4},
        {"rank": 0, "time": 1.5, "l1": 0.1},  # the trainer's row does not count
        {"rank": 2, "time": 2.0, "l1": 0.7},
        {"rank": 1, "time": 3.0, "l1": 0.45},
        {"rank": 2, "time": 4.0, "l1": 0.5},
    ]
    assert bench.first_time_all_below(rows, {1, 2}) == 4.0
    assert bench.first_time_all_below(rows[:4], {1, 2}) is None


def test_summary_line_is_ratios_to_the_single_process():
    bench = load("latency")
    single = {"actors": 0, "env_per_s": 100.0, "time_to_target": 50.0}
    apex = [
        {"actors": 4, "env_per_s": 361.0, "time_to_target": 30.0},
        {"actors": 8, "env_per_s": 620.0, "time_to_target": 21.0},
    ]
    bare = {"time_to_l1": 10.0}
    gfn = [{"time_to_l1": 3.7}, {"time_to_l1": None}]
    inference = [{"env_per_s": 200.0}, {"env_per_s": 310.0}]  # own forward, then the inference rank's run
    line = bench.summary_line(single, apex, 8, bare, gfn, inference)
    assert line == (
        "latency: actors4 3.61x actors8 6.20x time_to_target 0.42x oracle 0.37x inference 1.55x rllib not-run"
    )
    assert LAST_LINE.match(line)
    assert bench.summary_line(single, apex[:1], 8, None, [], []) == (
        "latency: actors4 3.61x actors8 - time_to_target - oracle - inference not-run rllib not-run"
    )


def _png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", header
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


def test_the_scaling_picture_has_a_panel_for_impala_only_when_it_ran(tmp_path):
    bench = load("latency")
    single = {"actors": 0, "env_per_s": 100.0}
    apex = [{"actors": n, "env_per_s": 90.0 * n} for n in (1, 2, 4)]
    impala = [{"actors": n, "env_per_s": 80.0 * n} for n in (1, 2)]
    both, alone = tmp_path / "both.png", tmp_path / "apex.png"
    bench.plot(single, apex, both, "title", {"actors": 0, "env_per_s": 70.0}, impala)
    bench.plot(single, apex, alone, "title", None, [])
    (wide, high), (narrow, high_alone) = _png_size(both), _png_size(alone)
    assert high == high_alone and wide == 2 * narrow, (wide, narrow)


def test_replot_draws_an_earlier_runs_json_and_refuses_one_without_cartpole(tmp_path):
    saved = tmp_path / "run.json"
    runs = {
        "single": {"actors": 0, "env_per_s": 100.0},
        "apex": [{"actors": n, "env_per_s": 90.0 * n} for n in (1, 2)],
        "impala_single": None,
        "impala": [],
    }
    saved.write_text(json.dumps(runs))
    picture = tmp_path / "scaling.png"
    command = [sys.executable, str(BENCHMARKS / "latency.py"), "--replot", str(saved), "--plot", str(picture)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert out.returncode == 0 and picture.exists(), out.stderr
    assert _png_size(picture)[0] < 1000  # one panel: no IMPALA rows in that run
    saved.write_text(json.dumps({**runs, "apex": []}))
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCHMARKS.parent)
    assert out.returncode == 2 and "no CartPole section" in out.stderr, out.stderr
