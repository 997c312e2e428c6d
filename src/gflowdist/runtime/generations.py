"""Generations of a run: which one this is, why the one before ended, how many steps it repeats.

Every resume, and every restart ``gflowdist run`` makes on its own
(``faults.max_restarts``, :mod:`gflowdist.cli.restarts`), starts a new
generation in the same run directory. The launcher hands a restarted job the
record of the restart in ``GFLOWDIST_RESTART`` (``{"restart": k, "of": n,
"previous_ended": "..."}``). The collector keeps ``progress.json`` in the
run directory up to date (the furthest step each trainer reported: at most
every 0.2 s while it runs, and once more at its end, failed or not, unless
its process is killed), so the next generation knows how far the one before
got. The steps it repeats are that step minus the step of the checkpoint it
resumed from (its manifest's). The progress line shows ``gen G``, and the
report's notes say::

    generation 1 (restart 1 of 1): the one before ended: lost rank 1 (trainer on vm): no heartbeat ...;
    resumed from gen-0000-step-000000025 at step 25, 7 steps repeated
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gflowdist.jobenv import RESTART_VARIABLE
from gflowdist.rundir import os_reason

__all__ = ["Reach", "restart_record", "generation_note", "PROGRESS_FILE"]

log = logging.getLogger("gflowdist.runtime")

PROGRESS_FILE = "progress.json"
#: progress.json is rewritten at most this often (so the furthest step it holds may lag by that much)
WRITE_EVERY_S = 0.2


class Reach:
    """The furthest step each trainer reported in this generation, kept in ``progress.json``.

    Writing it is best effort: a write that fails (a full disk) is logged, and the run goes on.
    """

    def __init__(self, run_dir: Path | None, generation: int):
        self.path = Path(run_dir) / PROGRESS_FILE if run_dir is not None else None
        self.generation = generation
        self.steps: dict[int, int] = {}
        self._written = 0.0
        self._unwritten = False
        self._failed = False
        self.before = _furthest(self.path)  # what the generation before reached (read before it is overwritten)

    def note(self, rank: int, steps_done: int) -> None:
        if steps_done <= self.steps.get(rank, 0):
            return
        self.steps[rank] = steps_done
        self._unwritten = True
        if time.monotonic() - self._written >= WRITE_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Write what was noted since the last write now: at the end of the generation, failed or not."""
        if self.path is None or not self._unwritten:
            return
        self._written, self._unwritten = time.monotonic(), False
        tmp = self.path.with_suffix(".json.tmp")
        try:
            tmp.write_text(
                json.dumps({"generation": self.generation, "steps": {str(r): s for r, s in sorted(self.steps.items())}})
            )
            os.replace(tmp, self.path)
        except OSError as err:
            if not self._failed:  # once: the next generation only counts its repeated steps with it
                log.warning(
                    "cannot write %s: %s; a resumed run will not know how far this one got", self.path, os_reason(err)
                )
            self._failed = True


def _furthest(path: Path | None) -> int | None:
    try:
        steps = json.loads(path.read_text())["steps"] if path is not None else {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return max((int(s) for s in steps.values()), default=None) if isinstance(steps, dict) else None


def restart_record() -> dict[str, Any] | None:
    """The launcher's record of the restart that started this job, if one did."""
    text = os.environ.get(RESTART_VARIABLE)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def generation_note(
    generation: int,
    restart: Mapping[str, Any] | None,
    resumed_from: str | None,
    resumed_step: int | None,
    reached_before: int | None,
) -> str | None:
    """One line for the console and the report's notes; None for a first generation."""
    if generation == 0:
        return None
    how = f" (restart {restart['restart']} of {restart['of']})" if restart else " (resumed)"
    parts = [f"generation {generation}{how}"]
    if restart:
        parts.append(f"the one before ended: {restart['previous_ended']}")
    if resumed_from is not None:
        where = f" at step {resumed_step}" if resumed_step is not None else ""
        repeated = ""
        if reached_before is not None and resumed_step is not None:
            count = max(0, reached_before - resumed_step)
            repeated = f", {count} step{'' if count == 1 else 's'} repeated"
        parts.append(f"resumed from {resumed_from}{where}{repeated}")
    return "; ".join(parts)
