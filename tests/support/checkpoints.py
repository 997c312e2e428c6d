"""A checkpoint made of random bytes with a true manifest: what the checks that need no torch accept."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = ["fake_checkpoint"]


def fake_checkpoint(run: Path, name: str, ranks: int, steps: dict[int, int] | None = None) -> Path:
    """``run/checkpoints/name`` with one file of random bytes per rank, each with its size and SHA-256 in
    ``MANIFEST.json`` (and the trainers' ``steps`` when given); returns the folder."""
    folder = Path(run) / "checkpoints" / name
    folder.mkdir(parents=True)
    files = {}
    for rank in range(ranks):
        data = os.urandom(1000 + rank)
        (folder / f"rank-{rank:05d}.pt").write_bytes(data)
        files[f"rank-{rank:05d}.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "world_size": ranks,
        "generation": 0,
        "complete": True,
        "files": files,
        **({"steps": {str(r): s for r, s in steps.items()}} if steps else {}),
    }
    (folder / "MANIFEST.json").write_text(json.dumps(manifest))
    return folder
