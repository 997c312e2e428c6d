"""A run's generations kept side by side: each one's report and trace, and a table of them all.

A resumed or restarted run (:mod:`gflowdist.runtime.generations`) writes its
report and trace into the same run directory as the generations before it.
Before it does, what an earlier generation (or an earlier attempt at this one)
left there is renamed, not overwritten::

    report.txt  report.json  report.png  trace.json        the newest generation's
    report.gen0.txt  report.gen0.json  report.gen0.png  trace.gen0.json
    report.gen1.txt  ...                                   (report.gen1-1.txt: a second attempt at gen 1)
    generations.json                                       one entry per generation that reached its end

Each generation that reaches its end appends its entry to ``generations.json``
(steps from and to, seconds, items made and their unit, why it ended, its
report's file); the newest report's *Generations* section is that table, the
whole run at a glance, and its training curves span every generation
(``metrics.jsonl`` keeps the rows of all of them).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GenerationFacts", "HISTORY_FILE", "KEPT_FILES", "keep_earlier", "record_generation", "read_history"]

log = logging.getLogger("gflowdist.runtime")

HISTORY_FILE = "generations.json"
#: What each generation writes and a later one keeps under ``<stem>.gen<G>.<ext>``.
KEPT_FILES = ("report.txt", "report.json", "report.png", "trace.json")


@dataclass(frozen=True)
class GenerationFacts:
    """What the collector knows of the generation that ends, for its report, its entry and the console.

    ``produced_before``: the items the ranks had made before this generation (its rate counts from them);
    ``warnings``: lines a person must see on the console and in the report's notes; ``curves``: the
    metrics ``report.curves`` asks the figure to draw; ``figure``: whether report.png is drawn at all.
    """

    generation: int = 0
    from_step: int = 0
    seconds: float | None = None
    produced_before: int = 0
    unit: str = "trajectories"
    warnings: tuple[str, ...] = ()
    curves: tuple[str, ...] = ()
    figure: bool = True


def read_history(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of ``generations.json`` (none when it is missing or unreadable)."""
    try:
        entries = json.loads((Path(run_dir) / HISTORY_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _write_history(run_dir: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    path = run_dir / HISTORY_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(list(entries), indent=1))
    os.replace(tmp, path)


def _generation_of(run_dir: Path) -> int | None:
    try:
        data = json.loads((run_dir / "report.json").read_text())
    except (OSError, ValueError):
        return None
    generation = data.get("generation") if isinstance(data, dict) else None
    return generation if isinstance(generation, int) else None


def _kept_name(run_dir: Path, name: str, generation: int | None) -> str:
    stem, _, ext = name.partition(".")
    tag = f"gen{generation}" if generation is not None else "earlier"
    for k in range(1000):
        candidate = f"{stem}.{tag}{'' if k == 0 else f'-{k}'}.{ext}"
        if not (run_dir / candidate).exists():
            return candidate
    raise FileExistsError(f"{run_dir / name}: 1000 kept copies exist already")


def keep_earlier(run_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Rename the report and trace an earlier generation left (see the module docstring); ``{old: new}``.

    The generation is the one its ``report.json`` names (else that of the newest entry of
    ``generations.json``); the entry that named ``report.txt`` names the kept copy from then on.
    """
    run_dir = Path(run_dir)
    present = [name for name in KEPT_FILES if (run_dir / name).exists()]
    if not present:
        return {}
    history = read_history(run_dir)
    generation = _generation_of(run_dir)
    if generation is None and history:
        generation = history[-1].get("generation")
    tag_source = "report.json" if "report.json" in present else present[0]
    kept_tag = _kept_name(run_dir, tag_source, generation).split(".")[1]  # one tag for all of its files
    renamed = {}
    for name in present:
        stem, _, ext = name.partition(".")
        new = f"{stem}.{kept_tag}.{ext}"
        if (run_dir / new).exists():
            new = _kept_name(run_dir, name, generation)
        os.replace(run_dir / name, run_dir / new)
        renamed[name] = new
    changed = False
    for entry in history:
        if entry.get("report") == "report.txt" and "report.txt" in renamed:
            entry["report"] = renamed["report.txt"]
            changed = True
    if changed:
        _write_history(run_dir, history)
    log.info("kept the files of an earlier generation: %s", ", ".join(f"{a} -> {b}" for a, b in renamed.items()))
    return renamed


def record_generation(run_dir: str | os.PathLike[str], entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Append ``entry`` (``generation``, ``steps``, ``seconds``, ``made``, ``unit``, ``ended``, ``report``) to
    ``generations.json``; returns every entry. A write that fails is logged: the run's result stands."""
    run_dir = Path(run_dir)
    entries = [*read_history(run_dir), dict(entry)]
    try:
        _write_history(run_dir, entries)
    except OSError as err:
        log.warning("cannot write %s: %s", run_dir / HISTORY_FILE, err)
    return entries
