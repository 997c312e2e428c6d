"""Fixtures every test module may ask for by name (defined in tests/support/).

- ``job_factory`` (:mod:`tests.support.jobs`): start ``gflowdist run`` jobs,
  each killed, whatever happened, when the test ends;
- ``local_job_factory`` (:mod:`tests.support.local_jobs`): the same jobs on the
  ``local`` engine, run to their end in the test's own process (ranks as threads);
- ``netns_hosts`` (:mod:`tests.support.netns`): two network-namespace hosts
  for a module (skipped with the reason where namespaces are unavailable);
- ``restore_waits`` (below): the process's waits for peers
  (:func:`gflowdist.comm.polling.set_crowded`) as they were, after a test that sets them.

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


@pytest.fixture
def restore_waits():
    from gflowdist.comm.polling import is_crowded, set_crowded

    before = is_crowded()
    yield
    set_crowded(before)


def pytest_sessionstart(session):
    """Compile the sources of gflowdist, the tests, the examples and the benchmarks once, so each of the
    suite's ~1,000 rank processes reads bytecode rather than compiling them again: where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines) nothing else writes it for an editable
    install (0.17-0.33 CPU-s per rank)."""
    root = Path(__file__).resolve().parent.parent
    for folder in (root / "src" / "gflowdist", root / "tests", root / "examples", root / "benchmarks"):
        compileall.compile_dir(folder, quiet=1, workers=1)


def pytest_collection_modifyitems(config, items):
    """Skip the ``gpu`` tests where torch sees no CUDA device (torch is imported only if there are some)."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    for item in marked:
        item.add_marker(skip)
