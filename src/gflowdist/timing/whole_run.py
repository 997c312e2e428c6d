"""The report's *Generations* section: every generation of a resumed or restarted run, one row each.

Rows are ``generations.json``'s entries (:mod:`gflowdist.runtime.history`)::

    Generations (the whole run)
      gen  steps     seconds  rate                 ended                  report
      ---  --------  -------  -------------------  ---------------------  ---------------
      0    0-310        14.2  1340 trajectories/s  signal SIGINT          report.gen0.txt
      1    300-600      13.9  1380 trajectories/s  done                   report.txt
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gflowdist.timing.text_table import table_lines

__all__ = ["generation_lines"]


def _rate(entry: Mapping[str, Any]) -> str:
    seconds, made = entry.get("seconds"), entry.get("made")
    if not isinstance(seconds, (int, float)) or not isinstance(made, int) or seconds <= 0:
        return "-"
    return f"{made / seconds:.0f} {entry.get('unit', 'trajectories')}/s"


def generation_lines(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The section's lines (see the module docstring)."""
    rows = []
    for e in entries:
        steps = e.get("steps") or ["?", "?"]
        seconds = e.get("seconds")
        rows.append(
            [
                str(e.get("generation", "?")),
                f"{steps[0]}-{steps[1]}",
                f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-",
                _rate(e),
                str(e.get("ended") or "done"),
                str(e.get("report", "-")),
            ]
        )
    return [
        "Generations (the whole run)",
        *table_lines(["gen", "steps", "seconds", "rate", "ended", "report"], rows, align="llrlll", indent="  "),
    ]
