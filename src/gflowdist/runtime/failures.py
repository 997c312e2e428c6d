"""A rank's failure in the user's terms: the headline, the user's frames first, where the whole traceback is.

:func:`describe_failure` turns an exception into a :class:`Failure`. Its
:attr:`~Failure.text` is what the console shows, once (the launcher prints it
from the failure file; see :func:`gflowdist.runtime.process.fail_job`)::

    gflowdist: rank 1 (trainer on vm) failed at step 30: RuntimeError: boom in loss
      in your code (most recent call last):
        File "/home/me/boom_roles.py", line 8, in loss
          raise RuntimeError("boom in loss")
      called by gflowdist: runtime/loops/trainer.py:212 in learn
      the whole traceback: runs/boom-20260101-120000/logs/rank-1.log

Frames outside the gflowdist package are the user's (their code and the
libraries it called), shown innermost last; gflowdist's own frames are
summed up in the one that called the user's code. An error gflowdist raised
itself about the user's code (a batch that is no batch) names the role class
and method in its message and shows where gflowdist raised it.
:attr:`~Failure.detail` (the whole traceback) goes to the rank's log.
:meth:`Failure.to_dict` is what the post-mortem writes (``failure.json``, the
top of report.txt).
"""

from __future__ import annotations

import json
import sys
import sysconfig
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import gflowdist
from gflowdist.errors import GflowdistError

__all__ = ["Failure", "describe_failure", "user_frame", "RankFailed", "PostMortemCalled", "LOST_RANK"]

#: :attr:`Failure.kind` of a rank that another rank (or the collector) noticed was gone
LOST_RANK = "lost rank"

_PACKAGE = str(Path(gflowdist.__file__).resolve().parent)
_LIBRARIES = tuple(
    str(Path(p).resolve()) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]} if p
)
#: At most this many of the user's frames are printed (the innermost); the log has them all.
SHOWN_FRAMES = 8


@dataclass(frozen=True)
class Failure:
    """One rank's failure: who (rank, role, host), when (step), what (exception), where (the user's frame)."""

    rank: int
    role: str
    host: str
    step: int | None
    kind: str  # "exception", LOST_RANK ("lost rank"), "interrupted", "refused batch"
    exception: str  # "RuntimeError: boom in loss"
    frame: str | None  # the innermost frame of the user's: "boom_roles.py:8 in loss"
    text: str  # the console's lines (headline first)
    detail: str  # the whole traceback, for the rank's log

    @property
    def headline(self) -> str:
        return self.text.splitlines()[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Failure:
        """The failure :meth:`to_dict` gave (sent in a ``failed`` message, read from ``failure.json``)."""
        step = data.get("step")
        return cls(
            rank=int(data["rank"]),
            role=str(data.get("role", "?")),
            host=str(data.get("host", "?")),
            step=None if step is None else int(step),
            kind=str(data.get("kind", "exception")),
            exception=str(data.get("exception", "")),
            frame=None if data.get("frame") is None else str(data["frame"]),
            text=str(data.get("text", "")),
            detail=str(data.get("detail", "")),
        )


def _is_gflowdist(filename: str) -> bool:
    return str(Path(filename).resolve()).startswith(_PACKAGE)


def _is_library(filename: str) -> bool:
    resolved = str(Path(filename).resolve())
    return resolved.startswith(_LIBRARIES) or "site-packages" in resolved or filename.startswith("<")


def _short(frame: traceback.FrameSummary) -> str:
    name = Path(frame.filename).name
    if _is_gflowdist(frame.filename):
        name = str(Path(frame.filename).resolve().relative_to(_PACKAGE))
    return f"{name}:{frame.lineno} in {frame.name}"


def user_frame(err: BaseException) -> str | None:
    """The innermost frame of the user's own code (not gflowdist's, not a library's), as ``file.py:8 in loss``."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if not _is_gflowdist(f.filename) and not _is_library(f.filename)]
    return _short(mine[-1]) if mine else None


def describe_failure(
    err: BaseException,
    *,
    rank: int,
    role: str,
    host: str,
    step: int | None,
    log_path: Path | str | None,
    kind: str = "exception",
    headline: str | None = None,
) -> Failure:
    """The :class:`Failure` of ``err`` on this rank (see the module docstring); ``headline`` replaces the first line
    (``gflowdist: rank R (ROLE on HOST) failed at step S: Type: message``)."""
    exception = f"{type(err).__name__}: {err}"
    where = f"rank {rank} ({role} on {host})" + (f" failed at step {step}" if step is not None else " failed")
    lines = [headline or f"gflowdist: {where}: {exception}"]
    frames = traceback.extract_tb(err.__traceback__)
    theirs = [i for i, f in enumerate(frames) if not _is_gflowdist(f.filename)]
    if theirs:
        first = theirs[0]
        shown = [frames[i] for i in theirs][-SHOWN_FRAMES:]
        lines.append("  in your code (most recent call last):")
        for frame in shown:
            lines.append(f'    File "{frame.filename}", line {frame.lineno}, in {frame.name}')
            if frame.line:
                lines.append(f"      {frame.line.strip()}")
        if first > 0:
            lines.append(f"  called by gflowdist: {_short(frames[first - 1])}")
    if frames and _is_gflowdist(frames[-1].filename):  # gflowdist raised it (about the user's batch, a peer...)
        lines.append(f"  raised by gflowdist: {_short(frames[-1])}")
    if log_path is not None:
        lines.append(f"  the whole traceback: {log_path}")
    detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return Failure(
        rank=rank,
        role=role,
        host=host,
        step=step,
        kind=kind,
        exception=exception,
        frame=user_frame(err),
        text="\n".join(lines),
        detail=detail,
    )


class RankFailed(GflowdistError):
    """On the collector: rank ``sender`` failed (its ``failed`` message arrived, with what it held in ``state``).

    ``failure.rank`` is the rank the failure names: ``sender`` itself, or, for a lost rank
    (``failure.kind == "lost rank"``), the peer that ``sender`` noticed was gone.
    """

    def __init__(self, failure: Failure, state: dict[str, Any], sender: int):
        self.failure, self.state, self.sender = failure, state, sender
        super().__init__(failure.headline)


class PostMortemCalled(GflowdistError):
    """On a rank: the collector asks for what I hold, since the run failed elsewhere."""

    def __init__(self) -> None:
        super().__init__("the collector asked for this rank's post-mortem: the run failed elsewhere")


def tell_where(run_dir: Path, *, since: float, err: TextIO | None = None) -> None:
    """After a failed job, on the launcher's console: where the post-mortem is (``failure.json`` written since
    ``since`` by this launch's job) and the command that resumes the run, when a checkpoint was complete
    (:mod:`gflowdist.runtime.postmortem`). ``gflowdist run`` says it after mpiexec or torchrun, and the local
    engine after its threads."""
    path = run_dir / "failure.json"
    try:
        if path.stat().st_mtime < since:
            return
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    err = err if err is not None else sys.stderr
    trace = f", {run_dir / 'trace.json'}" if (run_dir / "trace.json").is_file() else ""
    err.write(f"gflowdist: partial report: {run_dir / 'report.txt'}{trace} (gflowdist report {run_dir})\n")
    if written.get("resume"):
        err.write(f"gflowdist: to resume: {written['resume']}\n")
    err.flush()
