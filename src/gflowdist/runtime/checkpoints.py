"""Checkpoints without pickle: ``torch.save`` of tensors and plain values, loaded with ``weights_only=True``.

A run directory's checkpoints::

    checkpoints/gen-0000-step-000000050/rank-00002.pt   periodic (faults.checkpoint_every)
    checkpoints/gen-0000-final/rank-00002.pt            at the end of the run (also after Ctrl-C)
    checkpoints/<name>/MANIFEST.json                    written last, once every rank's file exists

``gen`` counts resumptions (a resumed run writes gen + 1). Files are written
to a temporary name and renamed; a checkpoint without a manifest is
incomplete and never resumed from.

Periodic checkpoints are a consistent cut: at step k every trainer settles its
outstanding sample requests, tells its actors, sends a marker to its buffer
after its last trajectory and waits for the buffer's acknowledgement; the
buffer saves once every live client's marker has arrived (so it holds exactly
the trajectories produced up to the cut), then everyone saves and reports to
the collector, which writes the manifest.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from gflowdist.errors import ConfigError

__all__ = ["checkpoint_name", "checkpoint_dir", "save_rank", "write_manifest", "latest_complete", "load_rank"]

_NAME = re.compile(r"^gen-(\d{4})-(?:step-(\d{9})|final)$")


def checkpoint_name(generation: int, step: int | None = None) -> str:
    """``gen-0003-step-000000050`` (periodic) or ``gen-0003-final``."""
    return f"gen-{generation:04d}-final" if step is None else f"gen-{generation:04d}-step-{step:09d}"


def step_of(name: str) -> int | None:
    """The step of a periodic checkpoint's name (``gen-0003-step-000000050`` -> 50); None for a final one."""
    head, _, step = name.rpartition("-step-")
    return int(step) if head and step.isdigit() else None


def trim_metrics(path: Path, step: int) -> int:
    """Drop the rows of ``path`` (metrics.jsonl) from step ``step`` on; returns how many were dropped.

    A run resumed from periodic checkpoint ``step-K`` repeats steps K, K+1, ...:
    the rows the interrupted run wrote for them would otherwise appear twice.
    Rows without a step are kept. The file is replaced atomically.
    """
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines(keepends=True):
        row = json.loads(line) if line.strip() else None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] >= step:
            dropped += 1
        elif line.strip():
            kept.append(line)
    if dropped:
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return dropped


def checkpoint_dir(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / "checkpoints" / name


def save_rank(run_dir: Path, name: str, rank: int, payload: dict[str, Any]) -> Path:
    folder = checkpoint_dir(run_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{rank:05d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def write_manifest(run_dir: Path, name: str, manifest: dict[str, Any]) -> None:
    folder = checkpoint_dir(run_dir, name)
    missing = [r for r in range(manifest["world_size"]) if not (folder / f"rank-{r:05d}.pt").exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {folder} lacks the files of ranks {missing}")
    tmp = folder / "MANIFEST.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / "MANIFEST.json")


def _order(name: str) -> tuple[int, int, int] | None:
    match = _NAME.match(name)
    if match is None:
        return None
    generation, step = match.groups()
    return int(generation), 1 if step is None else 0, int(step or 0)


def latest_complete(run_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """``(name, manifest)`` of the newest complete checkpoint, or None."""
    found = []
    for manifest in (Path(run_dir) / "checkpoints").glob("*/MANIFEST.json"):
        order = _order(manifest.parent.name)
        if order is not None:
            found.append((order, manifest.parent.name, json.loads(manifest.read_text())))
    if not found:
        return None
    _, name, manifest = max(found, key=lambda item: item[0])
    return name, manifest


def load_rank(run_dir: Path, name: str, rank: int) -> dict[str, Any]:
    path = checkpoint_dir(run_dir, name) / f"rank-{rank:05d}.pt"
    if not path.exists():
        raise ConfigError(f"checkpoint file {path} is missing", key="--resume")
    return torch.load(path, weights_only=True)
