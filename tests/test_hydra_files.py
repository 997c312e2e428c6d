"""The topology file a killed hydra proxy leaves in /tmp: noted while the job runs, removed by the launcher.

A stand-in proxy (a process named ``hydra_pmi_proxy`` holding a ``/tmp/hydra_hwloc_xmlfile_*`` file open, as
MPICH's proxy does from its first rank's ``MPI_Init`` on) and a process of another name holding such a file;
then a real job whose rank is killed with ``kill -9``: its proxy's file is gone once the launcher has ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gflowdist.cli.hydra_files import PROXY_NAME, TOPOLOGY_PREFIX, TopologyFiles, process_name, topology_file
from tests.support.jobs import pid_of_rank

# a process that names itself (PR_SET_NAME), opens the file, says so, and waits
HOLDER = """
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
held = open(sys.argv[2], "rb")
print("holding", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holders():
    started: list[tuple[subprocess.Popen, str]] = []

    def hold(name: str) -> tuple[subprocess.Popen, str]:
        fd, path = tempfile.mkstemp(prefix=Path(TOPOLOGY_PREFIX).name, dir=Path(TOPOLOGY_PREFIX).parent)
        os.close(fd)
        proc = subprocess.Popen([sys.executable, "-c", HOLDER, name, path], stdout=subprocess.PIPE, text=True)
        started.append((proc, path))
        assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
        return proc, path

    yield hold
    for proc, path in started:
        proc.kill()
        proc.wait()
        Path(path).unlink(missing_ok=True)


def test_a_proxys_file_is_noted_and_removed_after_it_was_killed_and_no_other_process_file_is_touched(holders):
    proxy, proxy_file = holders(PROXY_NAME)
    other, other_file = holders("python-other")
    files = TopologyFiles()
    files.note([proxy.pid, other.pid, 999_999_999])  # a pid that is no process: passed over
    assert files.files == {proxy_file}
    assert topology_file(other.pid) == other_file  # held, but by a process that is no proxy
    proxy.kill()
    proxy.wait()
    assert Path(proxy_file).exists()  # what hydra leaves when its proxy is killed
    assert files.remove() == ([proxy_file], [])
    assert not Path(proxy_file).exists() and Path(other_file).exists()


def test_a_file_its_proxy_removed_itself_is_no_error(holders):
    proxy, proxy_file = holders(PROXY_NAME)
    files = TopologyFiles()
    files.note([proxy.pid])
    Path(proxy_file).unlink()  # a proxy that exits normally unlinks its file
    assert files.remove() == ([], [])


def test_a_job_that_lost_a_rank_leaves_no_topology_file(job_factory):
    job = job_factory("run.steps=100000", "params.delay_s=0.005", "faults.peer_timeout_s=3", "faults.heartbeat_s=0.2")
    run = job.wait_for_metrics(4)
    proxies = [pid for pid in job.processes_left() if process_name(pid) == PROXY_NAME]
    assert proxies, "no hydra proxy among the job's processes"
    held = {topology_file(pid) for pid in proxies} - {None}
    deadline = time.monotonic() + 10  # a proxy makes its file at its first rank's MPI_Init: long before metrics
    while not held and time.monotonic() < deadline:
        time.sleep(0.1)
        held = {topology_file(pid) for pid in proxies} - {None}
    assert held, "the job's proxy holds no topology file"
    os.kill(pid_of_rank(run, 1), signal.SIGKILL)
    assert job.wait(60) != 0
    assert "lost rank 1 (trainer on" in job.output, job.output
    assert job.no_process_left()
    assert not [path for path in held if Path(path).exists()], f"left in /tmp: {held}"
