"""benchmarks/gpu.py on the CPU: the quick run with the CPU in the GPU's place (what CI runs), the one-line
refusal without CUDA (exit 2), a failed row (exit 1), and how a run directory is read."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.launching import base_env
from tests.support.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"


def load():
    return load_script(SCRIPT, "benchmark_gpu")


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def test_quick_run_on_the_cpu_prints_one_table_with_every_row(tmp_path):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--json", str(tmp_path / "gpu.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=base_env(TMPDIR=str(tmp_path)),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not list(tmp_path.glob("gflowdist-gpu-*"))  # its runs' temporary directory is removed after a pass
    rows = {cells(line)[0]: cells(line) for line in out.stdout.splitlines()[1:]}
    for name in (
        "HyperGrid learner steps/s",
        "Ape-X learner steps/s",
        "Ape-X wide learner steps/s",
        "2 trainers, 1 device steps/s",
    ):
        assert float(rows[name][2]) > 0, out.stdout
    assert float(rows["staging pageable"][2]) > 0 and float(rows["direct .to()"][2]) > 0
    assert float(rows["staging (default)"][2]) > 0
    assert rows["staging pinned"][2] == "-" and "needs CUDA" in rows["staging pinned"][-1]
    record = json.loads((tmp_path / "gpu.json").read_text())
    assert record["staging"]["default"] > 0 and record["staging"]["pinned"] is None
    (shared,) = record["shared"]["averaging"]
    assert shared["ranks"] == [0, 1] and shared["path"] == "host"
    assert "averaging: host memory on" in rows["2 trainers, 1 device steps/s"][-1]
    assert record["HyperGrid"]["learner"]["devices"]["0"] == "cpu"
    assert record["Ape-X"]["learner"]["publish_ms"] > 0  # the learner published to the coordinator


def test_without_cuda_the_default_run_says_so_in_one_line_and_exits_2():
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=120,
        env=base_env(CUDA_VISIBLE_DEVICES=""),  # no GPU, whatever this machine has
    )
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "--device cpu" in lines[0], out.stdout


def test_a_failed_row_prints_the_table_so_far_and_exits_1(monkeypatch, capsys, tmp_path):
    gpu = load()

    def broken(*_args, **_kwargs):
        raise gpu.BenchmarkError("gflowdist run ... failed (1): boom")

    made = {"steps_per_s": 10.0, "data_share": 0.25, "publish_ms": 1.5, "averaging": [], "devices": {}}
    monkeypatch.setattr(gpu, "apex", broken)
    monkeypatch.setattr(gpu, "hypergrid", lambda *a, **k: made)
    monkeypatch.setattr(gpu, "sharing", lambda *a, **k: made)
    assert gpu.main(["--device", "cpu", "--quick", "--out-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "FAILED: gflowdist run ... failed (1): boom" in captured.err
    assert f"the runs' directories: {tmp_path}" in captured.err  # kept, and named, after a failure
    lines = captured.out.splitlines()
    assert lines[0].startswith("benchmarks/gpu.py: GPU none (--device cpu)") and cells(lines[1])[0] == "setup"


def test_a_run_directory_is_read_into_rates_shares_and_the_averaging(tmp_path):
    gpu = load()
    rows = [
        {"rank": 0, "time": 1.0, "step": 0, "loss": 1.0},
        {"rank": 1, "time": 1.5, "step": 0, "env_steps": 5},  # an actor's row: not the learner's
        {"rank": 0, "time": 3.0, "step": 50, "loss": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    phases = {"loss": [0.5, 0.5], "stage": [0.25], "publish": [0.1, 0.3], "optimizer": [0.35]}
    finals = {"0": {"role": "trainer", "timing": {"phases": phases}}, "1": {"role": "actor", "timing": {}}}
    (tmp_path / "finals.json").write_text(json.dumps(finals))
    averaging = [{"group": 0, "ranks": [0], "path": "none", "engine": "", "reason": "a group of one trainer"}]
    (tmp_path / "devices.json").write_text(json.dumps({"devices": {"0": "cuda:0"}, "averaging": averaging}))
    got = gpu.learner_numbers(tmp_path)
    assert got["steps_per_s"] == pytest.approx(50 / 2.0)
    assert got["data_share"] == pytest.approx((0.25 + 0.4) / 2.0)
    assert got["publish_ms"] == pytest.approx(200.0)
    assert got["devices"] == {"0": "cuda:0"}
    assert gpu.devices("cuda", 4) == "[cuda,cpu,cpu,cpu]" and gpu.devices("cuda:0", 4, 2) == "[cuda:0,cuda:0,cpu,cpu]"
