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

The suite runs longest first (:func:`pytest_collection_modifyitems`): the
files of the longest tests, then every test that starts jobs or namespaces,
then the rest. With the README's ``-n 2 --dist load --maxschedchunk 1`` each
worker takes the next test when it finishes one, so the run's last minutes are
short tests on both workers rather than one long job on one of them.
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
    """Compile gflowdist's and the test jobs' sources once, so each of the suite's ~1,000 rank processes
    reads bytecode rather than compiling them again: where PYTHONDONTWRITEBYTECODE is set (as on this
    project's machines) nothing else writes it for an editable install (0.17-0.33 CPU-s per rank)."""
    root = Path(__file__).resolve().parent.parent
    for folder in (root / "src" / "gflowdist", root / "tests"):
        compileall.compile_dir(folder, quiet=1, workers=1)


#: The files of the suite's longest tests, longest first: 15-62 s each, the slowest 25 of a fresh clone's
#: ``.ci/run`` (2026-11-28, 2 idle cores, ``--durations=25``). A stale entry costs nothing but order.
LONGEST_FIRST = (
    "tests/test_replace_actor.py",
    "tests/test_console_end.py",
    "tests/test_trace_replay.py",
    "tests/test_keep_training.py",
    "tests/test_ranked_suites.py",
    "tests/test_benchmark_gpu.py",
    "tests/test_torch_comm_exit.py",
    "tests/test_resume_faults.py",
    "tests/test_inference_jobs.py",
    "tests/test_preemption.py",
    "tests/test_runtime_jobs.py",
    "tests/test_example_impala_cartpole.py",
    "tests/test_cli_prelaunch.py",
    "tests/test_docs_site.py",
    "tests/test_example_ppo.py",
)

#: Fixtures that start processes (jobs, network namespaces): their tests come before the in-process ones.
PROCESS_FIXTURES = frozenset({"job_factory", "netns_hosts"})


def start_order(item) -> int:
    """Where ``item`` starts (lower first): its file's place in :data:`LONGEST_FIRST`, then tests that start
    processes, then the rest; the sort is stable, so collection order holds within each."""
    path = item.nodeid.split("::", 1)[0]
    if path in LONGEST_FIRST:
        return LONGEST_FIRST.index(path)
    return len(LONGEST_FIRST) + (0 if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) else 1)


def pytest_collection_modifyitems(config, items):
    """Longest first (module docstring); skip the ``gpu`` tests where torch sees no CUDA device (torch is
    imported only if there are some)."""
    items.sort(key=start_order)
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: torch.cuda.is_available() is False on this machine")
    for item in marked:
        item.add_marker(skip)
