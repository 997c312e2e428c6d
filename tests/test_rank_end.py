"""How a rank's process ends (gflowdist.cli.rank_end), and where its failure message goes (the run directory)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gflowdist.cli.rank_end import exit_status
from gflowdist.cli.supervise import FAILURE_FILE_NAME, _report_failure, failure_file
from gflowdist.jobenv import FAILURE_FILE_VARIABLE, STDERR_RELAY_VARIABLE
from tests.support.launching import REPO, run_plain


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_a_rank_joins_its_threads_and_runs_its_exit_handlers_before_it_ends(job_factory, tmp_path, engine):
    """Every rank of a real job (3 ranks) ends at once after its job, but only once its non-daemon thread (still
    running when the job is over) has ended and its atexit handler has run: what an interpreter's exit does."""
    marks = tmp_path / "marks"
    marks.mkdir()
    job = job_factory("-n", "3", "--engine", engine, "run.steps=3", f"params.exit_marks={marks}", "report.figure=true")
    assert job.wait(180) == 0, job.output
    for rank in range(3):
        assert (marks / f"thread-{rank}").read_text() == "done", job.output
        # an MPI rank ends through the interpreter's exit, its objects frozen; a torch rank skips the teardown
        assert (marks / f"atexit-{rank}").read_text() == f"thread mark True frozen {engine == 'mpi'}", job.output
    run = job.run_dir()
    assert (run / "report.png").is_file() and (run / "trace.json").is_file() and (run / "ledger.json").is_file()
    assert "ledger balanced" in job.output.splitlines()[-1]
    assert not (run / FAILURE_FILE_NAME).exists()  # no rank failed: no failure file was ever made
    assert "finished:" in (run / "logs" / "rank-0.log").read_text()  # the log handler flushed at the exit
    assert job.no_process_left()


def _ended(code: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from gflowdist.cli.rank_end import run_then_end
        def late():
            time.sleep(0.3)
            print("thread done", flush=True)
        threading.Thread(target=late).start()
        atexit.register(lambda: print("atexit ran", flush=True))
        def job():
            {code}
        run_then_end(job)
        print("not reached")
        """
    )
    return run_plain([sys.executable, "-c", script], timeout=60, cwd=REPO)


def test_run_then_end_exits_with_the_jobs_status_after_its_threads_and_handlers():
    done = _ended("return 3")
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["thread done", "atexit ran"]


def test_a_system_exit_in_the_job_ends_the_process_as_the_interpreter_would():
    assert _ended("raise SystemExit(None)").returncode == 0
    assert _ended("raise SystemExit(-1)").returncode == 255
    said = _ended("raise SystemExit('gflowdist: stopped')")
    assert said.returncode == 1
    assert said.stdout.splitlines() == ["gflowdist: stopped", "thread done", "atexit ran"]  # as Python orders them


def test_exit_status_reads_a_system_exit_code_as_python_does(capsys):
    assert exit_status(None) == 0 and exit_status(4) == 4
    assert exit_status("why") == 1
    assert capsys.readouterr().err == "why\n"


def test_the_failure_file_is_in_the_run_directory_made_by_a_failing_rank_and_removed_once_read(tmp_path, monkeypatch):
    from gflowdist.runtime.process import announce_failure

    path = Path(failure_file(tmp_path))
    assert path.parent == tmp_path and path.name == FAILURE_FILE_NAME
    assert not path.exists()  # the launcher makes nothing: a run that does not fail leaves nothing behind
    monkeypatch.setenv(FAILURE_FILE_VARIABLE, str(path))
    monkeypatch.delenv(STDERR_RELAY_VARIABLE, raising=False)
    announce_failure("gflowdist: rank 1 (trainer) failed: on purpose")
    assert path.read_text() == "gflowdist: rank 1 (trainer) failed: on purpose\n\0"
    assert _report_failure(1) == "gflowdist: rank 1 (trainer) failed: on purpose"
    assert not path.exists()


def test_a_failure_file_that_cannot_be_written_gives_the_whole_message_on_stderr(tmp_path, monkeypatch, capsys):
    from gflowdist.jobenv import FAILURE_MARK
    from gflowdist.runtime.process import announce_failure

    monkeypatch.setenv(FAILURE_FILE_VARIABLE, str(tmp_path / "not-here" / FAILURE_FILE_NAME))  # another host's path
    monkeypatch.setenv(STDERR_RELAY_VARIABLE, "1")
    announce_failure("gflowdist: rank 2 (buffer) failed\n  at roles.py:12")
    assert capsys.readouterr().err == f"{FAILURE_MARK}gflowdist: rank 2 (buffer) failed\n  at roles.py:12\n"
