"""Smoke test of benchmarks/replay_local.py with a tiny budget (no timing asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "replay_local.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("replay_local", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_buffer_is_measured_against_the_naive_baseline():
    bench = load_benchmark()
    rows = bench.measure("small", 64, 8, 16, 0.01)
    assert [row[1] for row in rows] == list(bench.buffers(64))
    assert rows[0][4] == rows[0][6] == "1.00x"  # the baseline against itself
    for row in rows:
        assert float(row[3].replace(",", "")) > 0 and float(row[5].replace(",", "")) > 0


def test_large_items_are_about_one_mebibyte():
    bench = load_benchmark()
    batch = bench.make_batch("large", 1, torch.Generator().manual_seed(0))
    size = sum(t.numel() * t.element_size() for t in batch.values())
    assert 1 << 20 <= size < (1 << 20) + 4096
