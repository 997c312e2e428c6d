"""Generations of a run: which one this is, why the one before ended, how many steps it repeats.

Every resume, and every restart ``gflowdist run`` makes on its own
(``faults.max_restarts``, :mod:`gflowdist.cli.restarts`), starts a new
generation in the same run directory. The launcher hands a restarted job the
record of the restart in ``GFLOWDIST_RESTART`` (``{"restart": k, "of": n,
"previous_ended": "..."}``). The collector keeps ``progress.json`` in the
run directory up to date (at most every 0.2 s: the furthest step each
trainer reported), so the next generation knows how far the one before got,
and with the step of the checkpoint it resumed from, how many steps it
repeats. The progress line shows ``gen G``, and the report's notes say::

    generation 1 (restart 1 of 1): the one before ended: lost rank 1 (trainer on vm): no heartbeat ...;
    resumed from gen-0000-step-000000025 at step 25, 7 steps repeated
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

from gflowdist.jobenv import RESTART_VARIABLE

__all__ = ["Reach", "restart_record", "generation_note", "PROGRESS_FILE"]

PROGRESS_FILE = "progress.json"
#: progress.json is rewritten at most this often (so the furthest step it holds may lag by that much)
WRITE_EVERY_S = 0.2


class Reach:
    """The furthest step each trainer reported in this generation, kept in ``progress.json``."""

    def __init__(self, run_dir: Path | None, generation: int):
        self.path = Path(run_dir) / PROGRESS_FILE if run_dir is not None else None
        self.generation = generation
        self.steps: dict[int, int] = {}
        self._written = 0.0
        self.before = _furthest(self.path)  # what the generation before reached (read before it is overwritten)

    def note(self, rank: int, steps_done: int) -> None:
        if steps_done <= self.steps.get(rank, 0):
            return
        self.steps[rank] = steps_done
        now = time.monotonic()
        if self.path is not None and now - self._written >= WRITE_EVERY_S:
            self._written = now
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"generation": self.generation,
                                       "steps": {str(r): s for r, s in sorted(self.steps.items())}}))
            os.replace(tmp, self.path)


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


def generation_note(generation: int, restart: Mapping[str, Any] | None, resumed_from: str | None,
                    resumed_step: int | None, reached_before: int | None) -> str | None:
    """One line for the console and the report's notes; None for a first generation."""
    if generation == 0:
        return None
    how = f" (restart {restart['restart']} of {restart['of']})" if restart else " (resumed)"
    parts = [f"generation {generation}{how}"]
    if restart:
        parts.append(f"the one before ended: {restart['previous_ended']}")
    if resumed_from is not None:
        where = f" at step {resumed_step}" if resumed_step is not None else ""
        repeated = (f", {max(0, reached_before - resumed_step)} steps repeated"
                    if reached_before is not None and resumed_step is not None else "")
        parts.append(f"resumed from {resumed_from}{where}{repeated}")
    return "; ".join(parts)
