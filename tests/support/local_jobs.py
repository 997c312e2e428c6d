"""``gflowdist run --engine local`` from tests, in the test's own process: no interpreter or torch to start.

:class:`LocalJob` is :class:`tests.support.jobs.Job`'s twin for checks about
what a job computes and writes (its protocol, loops, ledger, metrics,
checkpoints, report), not about processes: it calls the real CLI
(:func:`gflowdist.cli.main`) with ``--engine local``, so the ranks are
threads of this process (:mod:`gflowdist.runtime.in_process`) speaking the
same protocol through the same loops. What only real processes show
(signals, kill -9, mpiexec or torchrun launching, several hosts) stays with
``job_factory``.

The job runs to its end when it is made (the CLI's stdout and stderr,
with every rank's output, captured as ``output``); ``no_process_left()`` is
true when none of its rank threads is still alive.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import TOY

#: the names run_in_process gives its rank threads
RANK_THREAD_PREFIX = "gflowdist-rank-"


def rank_threads() -> list[threading.Thread]:
    """Live rank threads of local-engine jobs in this process."""
    return [t for t in threading.enumerate() if t.name.startswith(RANK_THREAD_PREFIX) and t.is_alive()]


class LocalJob:
    """``gflowdist run CONFIG --engine local run.out_dir=<folder>/runs ARGS...`` run here, to its end.

    ``-n N`` in ``ARGS`` sets the rank count, as for the CLI; ``env`` sets variables for the job's
    duration; ``command`` another than ``run`` (``replay``) gets ``ARGS`` only.
    """

    def __init__(
        self,
        folder: Path,
        *args: str,
        config: Path | str | None = TOY,
        env: dict[str, str] | None = None,
        command: str = "run",
    ):
        from gflowdist.cli import main

        self.folder = folder
        self.out_dir = folder / "runs"
        argv = [command]
        if config is not None:
            argv.append(str(config))
        argv += ["--engine", "local", f"run.out_dir={self.out_dir}", *args] if command == "run" else list(args)
        self.argv = argv
        captured = io.StringIO()
        saved = {key: os.environ.get(key) for key in (env or {})}
        os.environ.update(env or {})
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                self.returncode = main(argv)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        self._output = captured.getvalue()
        (folder / "launcher.log").write_text(self._output)

    def wait(self, timeout: float) -> int:
        """The job's exit status (it ended before the constructor returned; ``timeout`` is Job's signature)."""
        return self.returncode

    @property
    def output(self) -> str:
        """Everything the CLI and the ranks printed (stdout and stderr together, as Job's log)."""
        return self._output

    def run_dir(self) -> Path:
        dirs = sorted(p for p in self.out_dir.glob("*") if p.is_dir())
        assert len(dirs) == 1, f"expected one run directory, found {dirs}\n{self.output}"
        return dirs[0]

    def no_process_left(self) -> bool:
        """No rank thread of any local job is still running in this process."""
        return rank_threads() == []


@pytest.fixture
def local_job_factory(tmp_path: Path) -> Iterator[Callable[..., LocalJob]]:
    """``run(*args, config=, env=, folder=, command=) -> LocalJob``: each job in its own folder under tmp_path
    unless ``folder`` names one (jobs that share a ``run.out_dir``)."""
    made: list[LocalJob] = []

    def run(*args: str, folder: Path | None = None, **kw: Any) -> LocalJob:
        if folder is None:
            folder = tmp_path / f"local{len(made)}"
            folder.mkdir()
        job = LocalJob(folder, *args, **kw)
        made.append(job)
        return job

    yield run
