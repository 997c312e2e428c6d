"""Run every file of tests/ranked/ under real ranks: mpiexec -n 1, 2, 4 and 2-3 gloo processes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from launching import run_mpi, run_torch

RANKED = sorted(p.name for p in (Path(__file__).parent / "ranked").glob("test_*.py"))
CONFIGS = [("mpi", 1), ("mpi", 2), ("mpi", 4), ("torch", 2), ("torch", 3)]
#: suites that also run at these extra sizes (the context needs a coordinator and two groups)
EXTRA = {"test_context.py": [("mpi", 5), ("torch", 4)]}
CASES = [(e, n, s) for s in RANKED for e, n in CONFIGS + EXTRA.get(s, [])]


@pytest.mark.parametrize("engine,nprocs,suite", CASES, ids=[f"{s[:-3]}-{e}-{n}" for e, n, s in CASES])
def test_ranked_suite(engine, nprocs, suite):
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=90",
            f"tests/ranked/{suite}"]
    runner = run_mpi if engine == "mpi" else run_torch
    result = runner(nprocs, argv, timeout=240, env={"GFLOWDIST_TEST_ENGINE": engine})
    result.check()
    # mpiexec may glue two ranks' last lines together: count the summaries, not the lines
    summaries = re.findall(r"\d+ passed[^\n]*? in [\d.]+s", result.output)
    assert len(summaries) == nprocs, f"expected a pytest summary from each of {nprocs} ranks:\n{result.output}"
    print(f"{engine} x {nprocs}: {summaries[0]}")
