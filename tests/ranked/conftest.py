"""Fixtures of the ranked suites: tests written once, run at every world size.

Each file here runs three ways (see tests/test_ranked_suites.py):
plainly inside the normal pytest run (a world of one), under
``mpiexec -n 1/2/4`` (GFLOWDIST_TEST_ENGINE=mpi) and as 2-3 gloo processes
(GFLOWDIST_TEST_ENGINE=torch). Cross-rank facts are asserted on every rank
(gather the values, then check the same thing everywhere). A failure on one
rank aborts the whole job instead of leaving the others in a collective.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.ranked.subgroups import half  # noqa: F401 (a fixture)

ENGINE = os.environ.get("GFLOWDIST_TEST_ENGINE", "local")


@pytest.fixture(scope="session")
def comm():
    from gflowdist.comm import world_comm

    if ENGINE == "torch":
        from datetime import timedelta

        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    world = world_comm(ENGINE)
    if world.engine != ENGINE:
        raise RuntimeError(f"expected the {ENGINE} engine, got {world.engine}")
    yield world
    world.barrier()
    if ENGINE == "torch":
        # torch's rule for a script that made its process group: destroy it before exit, or a gloo worker
        # may drop its last finished collective while the interpreter shuts down and abort the rank
        # ("terminate called without an active exception"); gflowdist's world over it is freed first
        from gflowdist.comm.select import release_world_comm

        release_world_comm()
        dist.destroy_process_group()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and ENGINE != "local":
        from gflowdist.comm import world_comm

        world = world_comm(ENGINE)
        if world.size > 1:
            sys.stderr.write(f"\n[rank {world.rank}] FAILED {item.nodeid}:\n{report.longreprtext}\n")
            sys.stderr.flush()
            if ENGINE == "mpi":
                world.abort(1)
            os._exit(1)
