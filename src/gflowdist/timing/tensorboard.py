"""TensorBoard event files of a run: every metric per rank and averaged, and the timing phases.

``metrics.jsonl`` stays the source of truth: this module only converts what a
run directory holds (``metrics.jsonl``, ``finals.json``, ``report.json``)
into event files, at the end of a run with ``run.tensorboard: true`` (which also writes the metrics live:
:mod:`gflowdist.timing.tensorboard_live`), or
later with ``gflowdist report RUN_DIR --tensorboard``::

    <run dir>/tensorboard/
      rank-<r>/  metrics/<name>        every metric trainer r logged, at its step
                 timing/<phase>        seconds of each iteration of that phase on rank r (every role)
      mean/      metrics/<name>        the report's curve: the mean over the trainers that logged the step
                 timing/<role>/<phase> per iteration, the mean over the role's ranks that reached it

``tensorboard --logdir runs`` then shows every run side by side (a run is
``<name>-<timestamp>/tensorboard/rank-0`` and so on). Wall times are the
run's start (``config.yaml``'s modification time) plus each row's ``time``
for metrics, and the write time for timing phases.

The files are written by ``torch.utils.tensorboard.SummaryWriter``, which
needs the ``tensorboard`` package (``pip install 'gflowdist[tensorboard]'``);
nothing here is imported before it is needed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gflowdist.errors import GflowdistError

__all__ = ["write_tensorboard", "tensorboard_unavailable_reason", "TENSORBOARD_DIR", "INSTALL_HINT"]

#: The folder of the event files, inside the run directory.
TENSORBOARD_DIR = "tensorboard"
INSTALL_HINT = "pip install 'gflowdist[tensorboard]' (the tensorboard package)"


def tensorboard_unavailable_reason() -> str | None:
    """None when the tensorboard package is installed (found without importing it), else why not."""
    if importlib.util.find_spec("tensorboard") is None:
        return f"the tensorboard package is not installed: {INSTALL_HINT}"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise GflowdistError(f"{path}: cannot read it ({err}): is this a finished gflowdist run directory?") from None


def _metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_tensorboard(run_dir: str | Path) -> Path:
    """Write the event files of ``run_dir`` (replacing earlier ones); returns the tensorboard folder."""
    reason = tensorboard_unavailable_reason()
    if reason is not None:
        raise GflowdistError(reason)
    from torch.utils.tensorboard import SummaryWriter

    run_dir = Path(run_dir)
    finals = _read_json(run_dir / "finals.json")
    curves = _read_json(run_dir / "report.json").get("curves", {})
    config = run_dir / "config.yaml"
    started = config.stat().st_mtime if config.exists() else None
    out = run_dir / TENSORBOARD_DIR
    shutil.rmtree(out, ignore_errors=True)
    per_rank = _by_rank(_metrics_rows(run_dir))
    roles = {int(rank): final.get("role", "?") for rank, final in finals.items()}
    for rank in sorted(roles):
        with SummaryWriter(log_dir=str(out / f"rank-{rank}")) as writer:
            for row in per_rank.get(rank, []):
                _add_row(writer, row, started)
            for phase, seconds in _phases(finals[str(rank)]).items():
                for iteration, value in enumerate(seconds):
                    writer.add_scalar(f"timing/{phase}", value, iteration)
    with SummaryWriter(log_dir=str(out / "mean")) as writer:
        for name, curve in curves.items():
            for x, y in zip(curve["x"], curve["y"], strict=False):
                if y is not None:
                    writer.add_scalar(f"metrics/{name}", y, int(x))
        for tag, values in _mean_phases(finals, roles).items():
            for iteration, value in enumerate(values):
                writer.add_scalar(tag, value, iteration)
    return out


def _by_rank(rows: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for row in rows:
        if _number(row.get("rank")):
            out.setdefault(int(row["rank"]), []).append(row)
    return out


def _add_row(writer: Any, row: Mapping[str, Any], started: float | None) -> None:
    step = int(row.get("step", 0))
    walltime = started + row["time"] if started is not None and _number(row.get("time")) else None
    for name, value in row.items():
        if name not in ("rank", "time", "step") and _number(value):
            writer.add_scalar(f"metrics/{name}", value, step, walltime=walltime)


def _phases(final: Mapping[str, Any]) -> dict[str, list[float]]:
    return {name: list(times) for name, times in final.get("timing", {}).get("phases", {}).items()}


def _mean_phases(finals: Mapping[str, Any], roles: Mapping[int, str]) -> dict[str, list[float]]:
    """``{"timing/<role>/<phase>": [mean over the role's ranks that reached iteration i, ...]}``."""
    gathered: dict[str, list[list[float]]] = {}
    for rank, role in roles.items():
        for phase, seconds in _phases(finals[str(rank)]).items():
            gathered.setdefault(f"timing/{role}/{phase}", []).append(seconds)
    means = {}
    for tag, series in gathered.items():
        longest = max(len(s) for s in series)
        means[tag] = [
            sum(s[i] for s in series if i < len(s)) / sum(1 for s in series if i < len(s)) for i in range(longest)
        ]
    return means
