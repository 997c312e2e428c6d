"""Run tests/ranked/ under real ranks: mpiexec -n 1, 2, 4 and 2-3 gloo processes.

One launch per configuration runs every ranked file (a launch costs seconds of
interpreter and torch start-up per rank); the inner pytest output, printed on
failure, names the failing test and rank. The same files also run plainly in
the normal suite, as a world of one.
"""

from __future__ import annotations

import sys

import pytest

from tests.support.launching import pytest_summaries, run_mpi, run_torch

CONFIGS = [("mpi", 1, None), ("mpi", 2, None), ("mpi", 4, None), ("torch", 2, None), ("torch", 3, None),
           # the context suite also at sizes with a coordinator and two agent groups
           ("mpi", 5, "test_context.py"), ("torch", 4, "test_context.py")]


@pytest.mark.parametrize("engine,nprocs,only", CONFIGS,
                         ids=[f"{e}-{n}" + (f"-{o[:-3]}" if o else "") for e, n, o in CONFIGS])
def test_ranked_suites(engine, nprocs, only):
    target = f"tests/ranked/{only}" if only else "tests/ranked"
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120", target]
    runner = run_mpi if engine == "mpi" else run_torch
    result = runner(nprocs, argv, timeout=480, env={"GFLOWDIST_TEST_ENGINE": engine})
    result.check()
    # mpiexec may glue two ranks' last lines together: count the summaries, not the lines
    summaries = pytest_summaries(result.output)
    assert len(summaries) == nprocs, f"expected a pytest summary from each of {nprocs} ranks:\n{result.output}"
    print(f"{engine} x {nprocs}: {summaries[0]}")
