"""Run tests/ranked/ under real ranks: mpiexec -n 1, 2, 4 and 2-3 gloo processes (some files at 3-5 more).

One launch per configuration runs every ranked file (a launch costs seconds of
interpreter and torch start-up per rank); the inner pytest output, printed on
failure, names the failing test and rank. The same files also run plainly in
the normal suite, as a world of one.
"""

from __future__ import annotations

import pytest

from tests.support.launching import pytest_summaries, ranked_pytest, run_mpi, run_torch

CONFIGS = [
    ("mpi", 1, ()),
    ("mpi", 2, ()),
    ("mpi", 4, ()),
    ("torch", 2, ()),
    ("torch", 3, ()),
    # the context suite also at sizes with a coordinator and two agent groups
    ("mpi", 5, ("test_context.py",)),
    ("torch", 4, ("test_context.py",)),
    # native groups (the context's and a user's Split) and the crowded all-reduce also at an odd MPI size
    ("mpi", 3, ("test_compat_native_groups.py", "test_host_reduce.py")),
]


@pytest.mark.parametrize(
    "engine,nprocs,only", CONFIGS, ids=[f"{e}-{n}" + "".join(f"-{o[:-3]}" for o in only) for e, n, only in CONFIGS]
)
def test_ranked_suites(engine, nprocs, only):
    targets = [f"tests/ranked/{name}" for name in only] or ["tests/ranked"]
    argv = ranked_pytest("--timeout=120", *targets)
    runner = run_mpi if engine == "mpi" else run_torch
    result = runner(nprocs, argv, timeout=480, env={"GFLOWDIST_TEST_ENGINE": engine})
    result.check()
    # mpiexec may glue two ranks' last lines together: count the summaries, not the lines
    summaries = pytest_summaries(result.output)
    assert len(summaries) == nprocs, f"expected a pytest summary from each of {nprocs} ranks:\n{result.output}"
    print(f"{engine} x {nprocs}: {summaries[0]}")
