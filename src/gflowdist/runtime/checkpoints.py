"""Checkpoints without pickle: ``torch.save`` of tensors and plain values, loaded with ``weights_only=True``.

Layout of a run directory's checkpoints::

    checkpoints/gen-0003/rank-00002.pt    one file per rank, written to a temp name then renamed
    checkpoints/gen-0003/MANIFEST.json    written by the collector once every rank's file exists

A generation without a manifest is incomplete and never resumed from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from gflowdist.errors import ConfigError

__all__ = ["generation_dir", "save_rank", "write_manifest", "latest_complete", "load_rank"]


def generation_dir(run_dir: Path, generation: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"gen-{generation:04d}"


def save_rank(run_dir: Path, generation: int, rank: int, payload: dict[str, Any]) -> Path:
    folder = generation_dir(run_dir, generation)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{rank:05d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def write_manifest(run_dir: Path, generation: int, manifest: dict[str, Any]) -> None:
    folder = generation_dir(run_dir, generation)
    missing = [r for r in range(manifest["world_size"]) if not (folder / f"rank-{r:05d}.pt").exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {folder} lacks the files of ranks {missing}")
    tmp = folder / "MANIFEST.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, folder / "MANIFEST.json")


def latest_complete(run_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """``(generation, manifest)`` of the newest complete checkpoint, or None."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for manifest in root.glob("gen-*/MANIFEST.json"):
        found.append((int(manifest.parent.name[4:]), json.loads(manifest.read_text())))
    return max(found, key=lambda item: item[0]) if found else None


def load_rank(run_dir: Path, generation: int, rank: int) -> dict[str, Any]:
    path = generation_dir(run_dir, generation) / f"rank-{rank:05d}.pt"
    if not path.exists():
        raise ConfigError(f"checkpoint file {path} is missing", key="--resume")
    return torch.load(path, weights_only=True)
