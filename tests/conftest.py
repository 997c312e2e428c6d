"""Fixtures every test module may ask for by name (defined in tests/support/).

- ``job_factory`` (:mod:`tests.support.jobs`): start ``gflowdist run`` jobs,
  each killed, whatever happened, when the test ends;
- ``local_job_factory`` (:mod:`tests.support.local_jobs`): the same jobs on the
  ``local`` engine, run to their end in the test's own process (ranks as threads);
- ``netns_hosts`` (:mod:`tests.support.netns`): two network-namespace hosts
  for a module (skipped with the reason where namespaces are unavailable).

The suite's jobs skip report.png (``GFLOWDIST_REPORT_FIGURE=0``, set below) unless a test
asks for it.

Tests marked ``gpu`` run where torch sees a CUDA device and are skipped,
with that reason, elsewhere (``pytest -m gpu`` runs only them).
"""

import compileall
import os
from pathlib import Path

import pytest

from gflowdist.config.figure_choice import FIGURE_VARIABLE

# no report.png in the suite's runs (about a second of each job's end, some 70 jobs) but where a test asks
# for it (report.figure=true) or checks that a run draws it by default (it sets the variable to 1)
os.environ.setdefault(FIGURE_VARIABLE, "0")

from tests.support.jobs import job_factory  # noqa: F401 (a fixture)
from tests.support.local_jobs import local_job_factory  # noqa: F401 (a fixture)
from tests.support.netns import netns_hosts  # noqa: F401 (a fixture)


def pytest_sessionstart(session):
    """Compile the sources of gflowdist, the tests, the examples and the benchmarks once, so each of the
    suite's ~1,000 rank processes reads bytecode rather than compiling them again: where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines) nothing else writes it for an editable
    install (0.17-0.33 CPU-s per rank)."""
    root = Path(__file__).resolve().parent.parent
    for folder in (root / "src" / "gflowdist", root / "tests", root / "examples", root / "benchmarks"):
        compileall.compile_dir(folder, quiet=1, workers=1)


#: Modules with tests of 15 s or more each on this project's 2-core machine (the suite's durations report),
#: longest first. Under ``-n 2 --dist worksteal`` each worker starts with one half of the collection, in order,
#: and then steals from the tail of the other's: these modules' tests go to the fronts of both halves, taken in
#: turn, so that each worker starts with long tests and the suite's last minutes are short tests both workers
#: share, not one long test that one worker runs while the other idles. Scheduling only: the same tests run.
#: Not here: modules whose cost is a module fixture (tests/test_cli_prelaunch.py, the namespace hosts'), which
#: each worker that runs one of their tests pays again.
LONG_FIRST = (
    "test_replace_actor.py",
    "test_ranked_suites.py",
    "test_keep_training.py",
    "test_trace_replay.py",
    "test_torch_comm_exit.py",
    "test_console_end.py",
    "test_docs_site.py",
    "test_resume_faults.py",
    "test_faults_remote.py",
    "test_inference_jobs.py",
    "test_benchmark_gpu.py",
    "test_warm_start.py",
    "test_preemption.py",
    "test_example_ppo.py",
)


@pytest.hookimpl(trylast=True)  # after ``-m`` deselected what it does: the halves are those of what runs
def pytest_collection_modifyitems(config, items):
    """Put the :data:`LONG_FIRST` modules' tests at the fronts of both halves; skip the ``gpu`` tests where torch
    sees no CUDA device (torch is imported only if there are some)."""
    rank = {name: index for index, name in enumerate(LONG_FIRST)}
    long = sorted((item for item in items if item.path.name in rank), key=lambda item: rank[item.path.name])
    rest = [item for item in items if item.path.name not in rank]
    first = long[0::2]
    cut = max(len(items) // 2 - len(first), 0)
    items[:] = [*first, *rest[:cut], *long[1::2], *rest[cut:]]
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    for item in marked:
        item.add_marker(skip)
