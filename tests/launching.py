"""Start multi-rank jobs from tests and always clean them up.

Every job runs in its own process group (session) with a deadline; whatever
happens (pass, failure, timeout, an exception in the test), the whole group is
killed before the call returns. Ports come from the OS (bind to port 0),
never a fixed 29500.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def mpiexec_path() -> str:
    candidate = BIN / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JobResult:
    returncode: int
    output: str
    timed_out: bool

    def check(self) -> "JobResult":
        if self.returncode != 0 or self.timed_out:
            state = "timed out" if self.timed_out else f"exited {self.returncode}"
            raise AssertionError(f"job {state}; output:\n{self.output[-20000:]}")
        return self


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the job's process group and every process carrying its marker (hydra moves ranks
    into sessions of their own, out of reach of the group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    marker = getattr(proc, "gflowdist_marker", None)
    if marker:
        for pid in processes_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


MARKER_VARIABLE = "GFLOWDIST_TEST_JOB"


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment holds ``GFLOWDIST_TEST_JOB=marker``."""
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":  # zombies are already dead
                            found.append(int(entry))
        except OSError:
            continue
    return found


def new_marker() -> str:
    import uuid

    return uuid.uuid4().hex


#: one pytest summary line ("19 passed in 7.87s", "3 passed, 1 skipped in 2.10s"); mpiexec may
#: glue two ranks' lines together ("19 passed in 7.87s19 passed in 7.83s"), so count matches, not lines
PYTEST_SUMMARY = re.compile(r"\d+ passed[^\n]*? in [\d.]+s")


def pytest_summaries(output: str) -> list[str]:
    """Every pytest summary in ``output``, also where two ranks' lines were printed as one."""
    return PYTEST_SUMMARY.findall(output)


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in list(env):  # never inherit an outer job's identity
        if name.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_")) or name in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "IN_MPI"):
            del env[name]
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_mpi(nprocs: int, argv: list[str], *, timeout: float = 120, env: dict | None = None,
            cwd: Path = REPO) -> JobResult:
    """``mpiexec -n nprocs argv...`` in its own process group, killed after ``timeout``.

    ``env`` holds extra variables on top of :func:`base_env`.
    """
    cmd = [mpiexec_path(), "-n", str(nprocs)] + argv
    marker = new_marker()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=base_env(**(env or {}), **{MARKER_VARIABLE: marker}), cwd=cwd,
                            start_new_session=True)
    proc.gflowdist_marker = marker
    try:
        out, _ = proc.communicate(timeout=timeout)
        return JobResult(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return JobResult(-9, out or "", True)
    finally:
        _kill_group(proc)


def run_torch(nprocs: int, argv: list[str], *, timeout: float = 120, env: dict | None = None,
              cwd: Path = REPO) -> JobResult:
    """``nprocs`` processes with torch's env:// rendezvous on a free loopback port.

    If any process fails, the others are killed at once (they would otherwise
    wait in a collective until gloo's timeout).
    """
    port = str(free_port())
    marker = new_marker()
    procs, logs = [], []
    try:
        for rank in range(nprocs):
            log = open(_log_path(rank), "w+")
            logs.append(log)
            rank_env = base_env(**(env or {}))
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(rank),
                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **{MARKER_VARIABLE: marker})
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True,
                                          env=rank_env, cwd=cwd, start_new_session=True))
            procs[-1].gflowdist_marker = marker
        deadline = time.monotonic() + timeout
        timed_out = False
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                _kill_group(p)
                p.wait()
        output = []
        for rank, log in enumerate(logs):
            log.seek(0)
            output.append(f"----- rank {rank} (exit {procs[rank].returncode}) -----\n{log.read()}")
        codes = [p.returncode for p in procs]
        code = next((c for c in codes if c != 0), 0)
        return JobResult(code, "\n".join(output), timed_out)
    finally:
        for p in procs:
            _kill_group(p)
        for log in logs:
            log.close()
            os.unlink(log.name)


def _log_path(rank: int) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"gflowdist-rank{rank}-", suffix=".log")
    os.close(fd)
    return path
