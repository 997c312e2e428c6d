"""What one line of ``gflowdist doctor`` is (:class:`Check`) and how a check runs other processes.

A check that needs another program (``mpiexec --version``, a child Python
that loads the MPI library, the 2-rank pings of :mod:`gflowdist.cli.doctor_ping`)
starts it with :class:`Launched`: each process in its own session, its output
in a temporary file, killed with its whole process group at a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from gflowdist.jobenv import without_launcher
from gflowdist.process_tree import kill_group

__all__ = ["Check", "Result", "OK", "MISSING", "FAILED", "Launched", "run_processes", "child_env", "last_line"]

OK, MISSING, FAILED = "ok", "MISSING", "FAILED"
#: Seconds the other processes of a launch get after one of them failed.
_GRACE_S = 5.0
#: Exit status reported for a command that could not be started (the shell's).
_NOT_STARTED = 127


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer.

    Attributes:
        name: what was checked (``"mpiexec"``, ``"mpi ping"``, ...).
        status: :data:`OK`, :data:`MISSING` (not installed / not found) or :data:`FAILED`
            (present but broken, too old, or the test did not pass).
        detail: the version, path or measurement; for a problem, what went wrong.
        fix: for a problem, the command or setting that fixes it (None when ok).
        essential: a problem here makes the exit status 1.
    """

    name: str
    status: str
    detail: str
    fix: str | None = None
    essential: bool = True

    @property
    def passed(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def child_env(**extra: str) -> dict[str, str]:
    """This environment less any launcher's variables, one thread per rank, unbuffered."""
    env = without_launcher(dict(os.environ))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def last_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


Result = tuple[int, str, bool]
"""(exit status, output, killed at the deadline) of one process."""


class Launched:
    """Processes started now, each in its own session, their output in temporary files.

    :meth:`finish` waits for them until ``timeout`` seconds after the start;
    when one fails the others get ``_GRACE_S`` (5) more seconds; then every
    process group still alive is killed. A temporary file, unlike a pipe,
    never blocks a chatty child.
    """

    def __init__(self, jobs: list[tuple[list[str], dict[str, str]]], timeout: float):
        self.deadline = time.monotonic() + timeout
        self._procs: list[subprocess.Popen | None] = []
        self._logs = []
        try:
            for argv, env in jobs:
                log = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
                self._logs.append(log)
                try:
                    proc = subprocess.Popen(
                        argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                except OSError as err:
                    log.write(f"cannot start {argv[0]}: {err}\n")
                    proc = None
                self._procs.append(proc)
        except BaseException:
            self.kill()
            raise

    def _running(self) -> list[subprocess.Popen]:
        return [p for p in self._procs if p is not None and p.poll() is None]

    def finish(self) -> list[Result]:
        """Wait (or kill at the deadline); one result per job, in order."""
        deadline, timed_out = self.deadline, False
        try:
            while self._running():
                now = time.monotonic()
                if any(p is None or p.poll() not in (None, 0) for p in self._procs):
                    deadline = min(deadline, now + _GRACE_S)
                if now > deadline:
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:
            self.kill()
        results = []
        for proc, log in zip(self._procs, self._logs, strict=False):
            log.seek(0)
            killed = timed_out and proc is not None and proc.returncode == -signal.SIGKILL
            results.append((_NOT_STARTED if proc is None else proc.returncode, log.read(), killed))
            log.close()
        return results

    def kill(self) -> None:
        """Kill every process group still alive (idempotent)."""
        for proc in self._running():
            kill_group(proc.pid)
            proc.wait()


def run_processes(jobs: list[tuple[list[str], dict[str, str]]], timeout: float) -> list[Result]:
    """Start ``jobs`` (``(argv, env)`` each) and wait for them: :class:`Launched` at once."""
    return Launched(jobs, timeout).finish()
