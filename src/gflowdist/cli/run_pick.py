"""Which run ``gflowdist report`` means: the one given, or the newest run in a folder of runs.

``gflowdist report`` with no argument opens the newest run under ``runs/``
(``run.out_dir``'s default); given a folder that is not itself a run
directory but holds some (``runs/``, ``~/exp/runs``), the newest of those.
*Newest* is the latest ``config.yaml`` a run's collector wrote (every run
directory has one); the choice is said on stderr::

    gflowdist report: the newest of 3 runs in runs: runs/hypergrid-20261127-175142
"""

from __future__ import annotations

from pathlib import Path

from gflowdist.errors import GflowdistError

__all__ = ["pick_run", "DEFAULT_RUNS", "RUN_MARKERS"]

#: Where ``gflowdist report`` looks without an argument: ``run.out_dir``'s default.
DEFAULT_RUNS = "runs"
#: A folder holding one of these is a run directory.
RUN_MARKERS = ("config.yaml", "report.json", "ledger.json", "metrics.jsonl")


def _is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in RUN_MARKERS)


def _written(folder: Path) -> float:
    times = [(folder / name).stat().st_mtime for name in RUN_MARKERS if (folder / name).is_file()]
    return max(times, default=0.0)


def pick_run(given: str | None) -> tuple[Path, str | None]:
    """``(run directory, what to say about the choice or None)``.

    Raises :class:`GflowdistError` (one line) when ``given`` (or ``runs/``) does not exist or holds no run.
    """
    folder = Path(given) if given is not None else Path(DEFAULT_RUNS)
    if given is not None and (_is_run(folder) or not folder.is_dir()):
        return folder, None  # a run directory, or something load_run names as missing
    if not folder.is_dir():
        raise GflowdistError(
            f"no run directory given and no {folder}/ here: give one, e.g. gflowdist report runs/NAME-TIMESTAMP"
        )
    runs = [d for d in folder.iterdir() if d.is_dir() and _is_run(d)]
    if not runs:
        raise GflowdistError(f"{folder}: no run directory in it (a run directory holds config.yaml and logs/)")
    newest = max(runs, key=_written)
    which = f"the newest of {len(runs)} runs" if len(runs) > 1 else "the only run"
    return newest, f"{which} in {folder}: {newest}"
