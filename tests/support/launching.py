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
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from gflowdist.jobenv import find_mpiexec, free_port, without_launcher
from gflowdist.process_tree import kill_group

__all__ = [
    "REPO",
    "MARKER_VARIABLE",
    "JobResult",
    "base_env",
    "find_mpiexec",
    "free_port",
    "kill_session",
    "lines",
    "new_marker",
    "processes_with_marker",
    "pytest_summaries",
    "run_mpi",
    "run_plain",
    "run_torch",
    "write",
]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class JobResult:
    returncode: int
    output: str
    timed_out: bool

    def check(self) -> JobResult:
        if self.returncode != 0 or self.timed_out:
            state = "timed out" if self.timed_out else f"exited {self.returncode}"
            raise AssertionError(f"job {state}; output:\n{self.output[-20000:]}")
        return self


def kill_session(proc: subprocess.Popen, marker: str | None = None) -> None:
    """SIGKILL the session ``proc`` leads (it was started with ``start_new_session=True``) and every
    process carrying ``marker`` (default: ``proc.gflowdist_marker``, if set): hydra moves ranks
    into sessions of their own, out of reach of the group. Does not wait for ``proc``."""
    kill_group(proc.pid)
    marker = marker or getattr(proc, "gflowdist_marker", None)
    if marker:
        for pid in processes_with_marker(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


#: Set in the environment of every job a test starts, so its processes can be found again in /proc.
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


def ranked_pytest(*args: str) -> list[str]:
    """The command line of a pytest run by every rank of a job: quiet, stopping at the first failure, with no
    cache and no hypothesis plugin. The ranked suites use no hypothesis, and its plugin took 2.3 of a rank's
    5.3 CPU-s of start-up and collection (24 ranks in the suite's ranked launches)."""
    return [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args]


#: one pytest summary line ("19 passed in 7.87s", "3 passed, 1 skipped in 2.10s"); mpiexec may
#: glue two ranks' lines together ("19 passed in 7.87s19 passed in 7.83s"), so count matches, not lines
PYTEST_SUMMARY = re.compile(r"\d+ passed[^\n]*? in [\d.]+s")


def pytest_summaries(output: str) -> list[str]:
    """Every pytest summary in ``output``, also where two ranks' lines were printed as one."""
    return PYTEST_SUMMARY.findall(output)


def base_env(**extra: str) -> dict[str, str]:
    """This environment for a job of its own: never an outer job's identity, one thread per rank, no GPU.

    The tests' roles build their models on the CPU; on a machine with a GPU, ``launch.devices: auto``
    would put their trainers on it and the first step would refuse the CPU model. A GPU test gives
    ``CUDA_VISIBLE_DEVICES`` in ``extra``.
    """
    env = without_launcher(dict(os.environ))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
    env.update(extra)
    return env


def run_mpi(
    nprocs: int, argv: list[str], *, timeout: float = 120, env: dict | None = None, cwd: Path = REPO
) -> JobResult:
    """``mpiexec -n nprocs argv...`` in its own process group, killed after ``timeout``.

    ``env`` holds extra variables on top of :func:`base_env`.
    """
    cmd = [find_mpiexec(), "-n", str(nprocs), *argv]
    marker = new_marker()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=base_env(**(env or {}), **{MARKER_VARIABLE: marker}),
        cwd=cwd,
        start_new_session=True,
    )
    proc.gflowdist_marker = marker
    try:
        out, _ = proc.communicate(timeout=timeout)
        return JobResult(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, _ = proc.communicate()
        return JobResult(-9, out or "", True)
    finally:
        kill_session(proc)


def write(tmp_path: Path, name: str, text: str) -> str:
    """``text`` (dedented) as the file ``tmp_path/name``; returns its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def run_plain(
    argv: list[str], *, timeout: float = 120, cwd: Path = REPO, env: dict | None = None
) -> subprocess.CompletedProcess:
    """One process (it may launch more) in its own process group, killed after ``timeout``; ``env`` holds extra
    variables on top of :func:`base_env`."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=base_env(**(env or {})),
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s:\n{out}") from None
    finally:
        kill_session(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def lines(output: str, word: str) -> list[str]:
    """The reports starting with ``word`` (two ranks' lines may arrive glued together)."""
    return [m.strip() for m in re.findall(rf"{word} .*?(?={word} |\n|$)", output)]


def run_torch(
    nprocs: int, argv: list[str], *, timeout: float = 120, env: dict | None = None, cwd: Path = REPO
) -> JobResult:
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
            rank_env.update(
                RANK=str(rank),
                WORLD_SIZE=str(nprocs),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                **{MARKER_VARIABLE: marker},
            )
            procs.append(
                subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=rank_env, cwd=cwd, start_new_session=True
                )
            )
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
                kill_session(p)
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
            kill_session(p)
        for log in logs:
            log.close()
            os.unlink(log.name)


def _log_path(rank: int) -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix=f"gflowdist-rank{rank}-", suffix=".log")
    os.close(fd)
    return path
