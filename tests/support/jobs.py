"""``gflowdist run`` from tests: one job in its own session, found again by a marker.

:class:`Job` starts the real CLI (``python -m gflowdist run CONFIG ...``) with
its output in a file and a unique ``GFLOWDIST_TEST_JOB=<marker>`` in the
environment of the launcher and therefore of every process it starts
(mpiexec, hydra's proxies, the ranks, also inside network-namespace hosts:
they share the machine's process table). ``no_process_left()`` scans
``/proc`` for that marker; a process-group check would prove nothing, since
hydra gives every proxy and rank a session of its own.

``job_factory`` is a pytest fixture (tests/conftest.py offers it to every
test module); every job it started is killed and its log closed when the test
ends, whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.launching import (
    MARKER_VARIABLE,
    REPO,
    base_env,
    free_port,
    kill_session,
    new_marker,
    processes_with_marker,
)

#: the toy job (tests/jobs/toy_roles.py): a linear model, a few ms a step
TOY = REPO / "tests" / "jobs" / "toy.yaml"
#: the HyperGrid example job
HYPERGRID = REPO / "examples" / "hypergrid" / "config.yaml"


class Job:
    """``gflowdist run CONFIG run.out_dir=<folder>/runs ARGS...`` in its own session.

    ``env`` adds variables on top of :func:`tests.support.launching.base_env`;
    ``cwd`` is where it starts (default ``folder``); ``log`` names its output
    file in ``folder`` (several jobs may share a folder). ``command`` another
    than ``run`` (``replay``) gets ``ARGS`` only. ``prefix`` runs it under another command (``timeout 20``).
    """

    def __init__(
        self,
        folder: Path,
        *args: str,
        config: Path | str | None = TOY,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log: str = "launcher.log",
        command: str = "run",
        prefix: tuple[str, ...] = (),
    ):
        self.folder = folder
        self.out_dir = folder / "runs"
        self.log = open(folder / log, "w+")
        self.marker = new_marker()
        cmd = [*prefix, sys.executable, "-m", "gflowdist", command]
        if config is not None:
            cmd.append(str(config))
        cmd += [f"run.out_dir={self.out_dir}", *args] if command == "run" else list(args)
        self.cmd = cmd
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=base_env(**(env or {}), **{MARKER_VARIABLE: self.marker}),
            cwd=cwd or folder,
            start_new_session=True,
        )

    def wait(self, timeout: float) -> int:
        """The launcher's exit status; a job still running after ``timeout`` s is killed and fails the test."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"job did not end within {timeout} s:\n{self.output}") from None

    @property
    def output(self) -> str:
        """Everything the launcher printed so far (its stdout and stderr, with the ranks' forwarded output)."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def run_dir(self) -> Path:
        dirs = sorted(p for p in self.out_dir.glob("*") if p.is_dir())
        assert len(dirs) == 1, f"expected one run directory, found {dirs}\n{self.output}"
        return dirs[0]

    def wait_for_metrics(self, lines: int, timeout: float = 90) -> Path:
        """Wait until metrics.jsonl has ``lines`` lines (the job is training); returns the run directory."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = list(self.out_dir.glob("*/metrics.jsonl"))
            if found and len(found[0].read_text().splitlines()) >= lines:
                return found[0].parent
            if self.proc.poll() is not None:
                raise AssertionError(f"job ended early ({self.proc.returncode}):\n{self.output}")
            time.sleep(0.1)
        raise AssertionError(f"no {lines} metrics lines after {timeout} s:\n{self.output}")

    def processes_left(self) -> list[int]:
        """Live processes of this job (launcher, mpiexec, proxies, ranks), from /proc."""
        return processes_with_marker(self.marker)

    def no_process_left(self) -> bool:
        return self.processes_left() == []

    def kill(self) -> None:
        """SIGKILL the launcher's session and every process carrying the marker."""
        kill_job([self.proc], self.marker)


def kill_job(procs: list[subprocess.Popen], marker: str) -> None:
    """SIGKILL the sessions these processes lead and every process carrying ``marker``; reap ``procs``."""
    for proc in procs:
        kill_session(proc, marker)
    for proc in procs:
        proc.wait()


@pytest.fixture
def job_factory(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``start(*args, config=, env=, folder=, cwd=, log=) -> Job``; each job runs in its own folder under
    tmp_path unless ``folder`` names one (jobs that share a ``run.out_dir``)."""
    jobs: list[Job] = []

    def start(*args: str, folder: Path | None = None, **kw: Any) -> Job:
        if folder is None:
            folder = tmp_path / f"job{len(jobs)}"
            folder.mkdir()
        job = Job(folder, *args, **kw)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()
        job.log.close()


def pid_of_rank(run_dir: Path, rank: int) -> int:
    """The pid a rank logged in logs/rank-N.log ("... pid NNN")."""
    text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
    return int(text.split(" pid ")[1].split()[0])


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def layout_rows(run_dir: Path) -> dict[int, dict[str, str]]:
    """layout.txt as ``{rank: {"role", "host", "buffer", "group"}}`` (the table under the summary line)."""
    lines = (run_dir / "layout.txt").read_text().splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "role", "host"])
    rows = {}
    for line in lines[header + 1 :]:
        words = line.split()
        if not words or not words[0].isdigit():
            break
        rows[int(words[0])] = {"role": words[1], "host": words[2], "buffer": words[3], "group": words[4]}
    return rows


# ---- jobs across network-namespace hosts (tests/netns.py) -------------------------------------


def namespace_processes(hs: Any) -> dict[str, list[int]]:
    """``{host name: pids}`` of every process inside each namespace host of the set (``ip netns pids``)."""
    found = {}
    for host in hs.hosts:
        out = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True, check=True)
        found[host.name] = [int(p) for p in out.stdout.split()]
    return found


class HostRanksJob:
    """A torch job started by hand on namespace hosts: ``python -m gflowdist run CONFIG ...`` per rank.

    Rank ``r`` runs on host ``placement[r]`` with the env:// variables of a
    torch launcher (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` =
    host 0's address, ``MASTER_PORT`` from the OS) and ``GLOO_SOCKET_IFNAME``;
    inside such a job ``gflowdist run`` just runs. Each rank's output goes to
    ``<folder>/rank-N.out``.
    """

    def __init__(
        self,
        folder: Path,
        hs: Any,
        placement: list[int],
        *args: str,
        config: Path = TOY,
        env: dict[str, str] | None = None,
    ):
        from tests.support.netns import IFNAME

        self.folder = folder
        self.out_dir = folder / "runs"
        self.marker = new_marker()
        self.port = free_port()
        self.logs = []
        self.procs: list[subprocess.Popen] = []
        argv = [sys.executable, "-m", "gflowdist", "run", str(config), f"run.out_dir={self.out_dir}", *args]
        for rank, host_index in enumerate(placement):
            local_rank = placement[:rank].count(host_index)
            rank_env = base_env(**(env or {}), **{MARKER_VARIABLE: self.marker})
            rank_env.update(
                RANK=str(rank),
                WORLD_SIZE=str(len(placement)),
                LOCAL_RANK=str(local_rank),
                MASTER_ADDR=hs.hosts[0].ip,
                MASTER_PORT=str(self.port),
                GLOO_SOCKET_IFNAME=IFNAME,
            )
            self.logs.append(open(folder / f"rank-{rank}.out", "w+"))
            self.procs.append(
                subprocess.Popen(
                    hs.exec_argv(hs.hosts[host_index], argv),
                    stdout=self.logs[-1],
                    stderr=subprocess.STDOUT,
                    env=rank_env,
                    cwd=folder,
                    start_new_session=True,
                )
            )

    def wait(self, timeout: float) -> list[int]:
        """Every rank's exit status; ranks still running after ``timeout`` s are killed and the test fails."""
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs):
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"torch job did not end within {timeout} s:\n{self.output}")
            time.sleep(0.1)
        return [p.returncode for p in self.procs]

    @property
    def output(self) -> str:
        parts = []
        for rank, log in enumerate(self.logs):
            log.flush()
            log.seek(0)
            parts.append(f"----- rank {rank} -----\n{log.read()}")
        return "\n".join(parts)

    def run_dir(self) -> Path:
        dirs = sorted(p for p in self.out_dir.glob("*") if p.is_dir())
        assert len(dirs) == 1, f"expected one run directory, found {dirs}\n{self.output}"
        return dirs[0]

    def processes_left(self) -> list[int]:
        return processes_with_marker(self.marker)

    def kill(self) -> None:
        kill_job(self.procs, self.marker)

    def close(self) -> None:
        self.kill()
        for log in self.logs:
            log.close()


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket process ``pid`` listens on (IPv4 and IPv6, from /proc).

    A wildcard is ``"0.0.0.0"`` or ``"::"``; an IPv4-mapped IPv6 address is
    given as its IPv4 form.
    """
    import ipaddress

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, width in (("tcp", 4), ("tcp6", 16)):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A = TCP_LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc prints the address as 32-bit words in host (little-endian) order
            ordered = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
            addr = ipaddress.ip_address(ordered)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            found.append((str(addr), int(hex_port, 16)))
    return found
