"""VirTex's launch, for real: workers, a failing worker, two "machines", an existing MPI job.

Uses the helpers of tests/test_launchers.py; every job runs in its own
process group with a deadline.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support.launching import REPO, base_env, free_port, kill_session, lines, run_mpi, run_plain, write

PY = sys.executable

VIRTEX_SCRIPT = """
import os, sys
import torch
from gflowdist.compat import virtex
from gflowdist.errors import PeerLostError
sys.stdout.reconfigure(line_buffering=True, write_through=False)  # a line per write: mpiexec never glues two
# ranks' lines (PYTHONUNBUFFERED=1 writes print's newline on its own; gflowdist run does this for its ranks)

def job(tag):
    rank = virtex.get_rank()
    values = {"v": torch.tensor(float(rank))}
    virtex.average_across_processes(values)
    print(f"JOB {tag} RANK {rank} SIZE {virtex.get_world_size()} AVG {float(values['v'])} "
          f"IN_PARENT {os.getpid() == int(os.environ['TEST_PARENT_PID'])}", flush=True)
    if "--fail" in sys.argv and rank == 1:
        raise ValueError("boom from rank 1")
    virtex.synchronize()

if __name__ == "__main__":  # spawned workers import this file: only the parent launches
    os.environ["TEST_PARENT_PID"] = str(os.getpid())  # spawned workers inherit it
    mode = sys.argv[1]
    try:
        if mode == "local":
            virtex.launch(job, num_gpus_per_machine=2, dist_url="auto", args=("local",))
        elif mode == "machine":
            virtex.launch(job, num_machines=2, num_gpus_per_machine=1, machine_rank=int(sys.argv[2]),
                          dist_url=sys.argv[3], args=("machine",))
        else:
            virtex.launch(job, num_gpus_per_machine=int(sys.argv[2]), args=("injob",))
    except PeerLostError as exc:
        print(f"RAISED rank={exc.rank}\\n{exc}", flush=True)
        sys.exit(0)
    print("LAUNCH RETURNED", flush=True)
"""


# -- launch (VirTex) ---------------------------------------------------------------


def test_launch_two_gloo_workers_on_cpu_original_needs_nccl(tmp_path):
    """The original initialises NCCL unconditionally: without CUDA it cannot start."""
    result = run_plain([PY, write(tmp_path, "virtex_job.py", VIRTEX_SCRIPT), "local"])
    assert result.returncode == 0, result.stdout
    assert sorted(lines(result.stdout, "JOB")) == [
        "JOB local RANK 0 SIZE 2 AVG 0.5 IN_PARENT False",
        "JOB local RANK 1 SIZE 2 AVG 0.5 IN_PARENT False",
    ]
    assert "LAUNCH RETURNED" in result.stdout


def test_launch_failing_worker_raises_with_its_traceback(tmp_path):
    result = run_plain([PY, write(tmp_path, "virtex_job.py", VIRTEX_SCRIPT), "local", "--fail"], timeout=90)
    assert result.returncode == 0, result.stdout
    assert "RAISED rank=1" in result.stdout
    assert "Traceback" in result.stdout and "ValueError: boom from rank 1" in result.stdout
    assert "LAUNCH RETURNED" not in result.stdout


def test_launch_two_machines_meet_at_one_url(tmp_path):
    script = write(tmp_path, "virtex_job.py", VIRTEX_SCRIPT)
    url = f"tcp://127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [PY, script, "machine", str(m), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=base_env(),
            cwd=REPO,
            start_new_session=True,
        )
        for m in (0, 1)
    ]
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            kill_session(p)
    assert [p.returncode for p in procs] == [0, 0], outputs
    jobs = sorted(line for out in outputs for line in lines(out, "JOB"))
    assert jobs == [
        "JOB machine RANK 0 SIZE 2 AVG 0.5 IN_PARENT False",
        "JOB machine RANK 1 SIZE 2 AVG 0.5 IN_PARENT False",
    ]


def test_launch_inside_an_mpi_job_runs_in_place(tmp_path):
    script = write(tmp_path, "virtex_job.py", VIRTEX_SCRIPT)
    result = run_mpi(2, [PY, script, "injob", "2"]).check()
    assert sorted(lines(result.output, "JOB")) == [
        "JOB injob RANK 0 SIZE 2 AVG 0.5 IN_PARENT True",
        "JOB injob RANK 1 SIZE 2 AVG 0.5 IN_PARENT True",
    ]


def test_of_the_workers_found_failed_together_the_first_to_fail_is_named():
    """Worker 1 raises and worker 0 fails on the closed connection after it; the supervisor may find both
    gone at once, and must name worker 1 (its report's time is earlier), not the lower index."""
    from gflowdist.launch.spawn import _first_failure

    cause, echo = b"105.25\nTraceback: ValueError: boom\n", b"105.5\nTraceback: connection closed by peer\n"
    assert _first_failure({0: echo, 1: cause}) == (1, "Traceback: ValueError: boom")
    assert _first_failure({0: cause, 1: echo}) == (0, "Traceback: ValueError: boom")
    assert _first_failure({0: b"", 1: echo}) == (1, "Traceback: connection closed by peer")  # no report: last
    assert _first_failure({0: b"", 2: b""}) == (0, "")  # nothing to go by: the lower index
    assert _first_failure({3: cause, 1: cause}) == (1, "Traceback: ValueError: boom")  # a tie: the lower index
