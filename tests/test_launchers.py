"""mpi_fork and fork, for real: jobs in subprocesses, each in its own process group.

Each script prints one line per rank; the tests count and parse them. A
plain run starts with the launcher variables stripped (tests/support/launching.py
base_env), so the launcher under test decides everything. VirTex's launch
is tested in tests/test_compat_virtex_launch.py.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from tests.support.launching import lines, run_mpi, run_plain, run_torch, write

PY = sys.executable

SPINUP_SCRIPT = """
import sys
from gflowdist.compat.spinup import mpi_fork, mpi_sum, num_procs, proc_id
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # a line per write: mpiexec never glues two
# ranks' lines (PYTHONUNBUFFERED=1 writes print's newline on its own; gflowdist run does this for its ranks)

mpi_fork(int(sys.argv[1]))
total = mpi_sum(1)
print(f"RANK {proc_id()} SIZE {num_procs()} SUM {int(total)}", flush=True)
if len(sys.argv) > 2 and proc_id() == 1:
    sys.exit(int(sys.argv[2]))
"""

OMNISAFE_SCRIPT = """
import os, sys
from gflowdist.compat import omnisafe
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # a line per write: mpiexec never glues two
# ranks' lines (PYTHONUNBUFFERED=1 writes print's newline on its own; gflowdist run does this for its ranks)

if omnisafe.fork(2, bind_to_core="--bind" in sys.argv):
    print("PARENT DONE", flush=True)
    sys.exit(0)
rank = omnisafe.get_rank()
cpus = len(os.sched_getaffinity(0))
print(f"WORKER {rank} SIZE {omnisafe.world_size()} SUM {int(omnisafe.dist_sum(1))} CPUS {cpus}", flush=True)
if "--fail" in sys.argv and rank == 1:
    raise RuntimeError("worker boom")
"""

# -- mpi_fork ----------------------------------------------------------------------


def test_mpi_fork_never_nests_under_mpiexec_original_does(tmp_path):
    """``mpiexec -n 2 python job.py`` calling mpi_fork(2): the original (IN_MPI only) starts 2 x 2 ranks."""
    result = run_mpi(2, [PY, write(tmp_path, "job.py", SPINUP_SCRIPT), "2"]).check()
    assert sorted(lines(result.output, "RANK")) == ["RANK 0 SIZE 2 SUM 2", "RANK 1 SIZE 2 SUM 2"]


def test_mpi_fork_exits_with_the_failing_ranks_status(tmp_path):
    result = run_plain([PY, write(tmp_path, "job.py", SPINUP_SCRIPT), "2", "3"])
    assert result.returncode == 3, result.stdout


def test_mpi_fork_keeps_module_mode_original_loses_it(tmp_path):
    """Started as ``python -m pkgx.job``, the ranks run the module: its relative import works.
    The original re-runs ``sys.argv`` (the file path), where the relative import fails."""
    package = tmp_path / "pkgx"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helper.py").write_text("VALUE = 41\n")
    (package / "job.py").write_text(
        textwrap.dedent("""
        from .helper import VALUE
        import sys
        from gflowdist.compat.spinup import mpi_fork, num_procs, proc_id
        sys.stdout.reconfigure(line_buffering=True, write_through=False)  # a line per write (see above)
        mpi_fork(2)
        print(f"RANK {proc_id()} SIZE {num_procs()} VALUE {VALUE + 1}", flush=True)
    """)
    )
    result = run_plain([PY, "-m", "pkgx.job"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert sorted(lines(result.stdout, "RANK")) == ["RANK 0 SIZE 2 VALUE 42", "RANK 1 SIZE 2 VALUE 42"]


# -- fork (OmniSafe) ---------------------------------------------------------------


def _own_tmpdir(tmp_path: Path) -> Path:
    """A ``TMPDIR`` of the test's own: what a run leaves in it is seen (plain torchrun leaves a
    ``torchelastic_XXXXXXXX`` folder in every run)."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


def test_fork_runs_workers_under_torchrun_bound_to_cores(tmp_path):
    """Each worker is pinned to one CPU; the original hands ``-bind-to core`` to torchrun, which fails."""
    tmpdir = _own_tmpdir(tmp_path)
    script = write(tmp_path, "train.py", OMNISAFE_SCRIPT)
    result = run_plain([PY, script, "--bind"], timeout=180, env={"TMPDIR": str(tmpdir)})
    assert result.returncode == 0, result.stdout
    assert sorted(lines(result.stdout, "WORKER")) == ["WORKER 0 SIZE 2 SUM 2 CPUS 1", "WORKER 1 SIZE 2 SUM 2 CPUS 1"]
    assert result.stdout.rstrip().endswith("PARENT DONE")
    assert list(tmpdir.iterdir()) == []  # torchrun's log folder is gone


def test_fork_failing_worker_fails_the_parent(tmp_path):
    tmpdir = _own_tmpdir(tmp_path)
    result = run_plain(
        [PY, write(tmp_path, "train.py", OMNISAFE_SCRIPT), "--fail"], timeout=180, env={"TMPDIR": str(tmpdir)}
    )
    assert result.returncode != 0
    assert "worker boom" in result.stdout and "workers failed" in result.stdout
    assert "PARENT DONE" not in result.stdout
    assert list(tmpdir.iterdir()) == []


def test_fork_inside_a_torch_job_starts_nothing(tmp_path):
    result = run_torch(2, [PY, write(tmp_path, "train.py", OMNISAFE_SCRIPT)], timeout=120).check()
    assert sorted(w.rsplit(" CPUS", 1)[0] for w in lines(result.output, "WORKER")) == [
        "WORKER 0 SIZE 2 SUM 2",
        "WORKER 1 SIZE 2 SUM 2",
    ]
    assert "PARENT DONE" not in result.output
