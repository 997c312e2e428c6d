"""Checkpoints you can trust: ``torch.save`` of tensors and plain values, a checksum per file.

A run directory's checkpoints::

    checkpoints/gen-0000-step-000000050/rank-00002.pt   periodic (faults.checkpoint_every)
    checkpoints/gen-0000-final/rank-00002.pt            at the end of the run (also after Ctrl-C)
    checkpoints/<name>/MANIFEST.json                    written last, once every rank's file exists

``gen`` counts resumptions (a resumed or restarted run writes gen + 1).

Writing. Each rank writes its file to a temporary name, hashing the bytes as
they go (SHA-256), flushes and fsyncs it, then renames it; it reports the
size and digest to the collector, which writes ``MANIFEST.json`` (with every
file's size and digest) once every rank's file exists. A checkpoint without a
manifest is incomplete and never resumed from. A write that fails (no space
left, permission denied) raises :class:`~gflowdist.errors.CheckpointError`
naming the file and the OS reason, removes the temporary file and leaves
the checkpoint without a manifest, so the previous complete checkpoint stays
the newest one a resume uses.

Reading. :func:`load_rank` checks the file against the manifest (present,
size, digest) before ``torch.load(..., weights_only=True)``; any problem is a
``CheckpointError`` naming the file and what is wrong (missing, truncated,
changed after it was written, not a checkpoint). torch's own message is
never passed on where it advises loading with ``weights_only=False``.
:func:`candidates` lists the complete checkpoints newest first;
:mod:`gflowdist.runtime.resume` picks the newest intact one. The checks that
need no torch (names, manifest, size, digest) live in ``gflowdist.rundir``,
so that ``gflowdist run --resume`` makes them before it launches anything.

Periodic checkpoints are a consistent cut: at step k every trainer settles its
outstanding sample requests, tells its actors, sends a marker to its buffer
after its last trajectory and waits for the buffer's acknowledgement; the
buffer saves once every live client's marker has arrived (so it holds exactly
the trajectories produced up to the cut), then everyone saves and reports to
the collector, which writes the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

from gflowdist.errors import CheckpointError
from gflowdist.rundir import (
    MANIFEST,
    check_file,
    checkpoint_dir,
    checkpoint_name,
    checkpoint_names,
    checkpoint_step,
    os_reason,
    rank_file,
    read_manifest,
    step_of,
)
from gflowdist.runtime.ledger import Ledger

if TYPE_CHECKING:
    from gflowdist.replay import ReplayBuffer
    from gflowdist.runtime.roles import BaseRole
    from gflowdist.runtime.state import RunState

__all__ = [
    "checkpoint_name",
    "checkpoint_dir",
    "rank_file",
    "save_rank",
    "write_manifest",
    "read_manifest",
    "checkpoint_names",
    "candidates",
    "latest_complete",
    "load_rank",
    "step_of",
    "checkpoint_step",
    "trim_metrics",
    "MANIFEST",
    "CheckpointSaver",
]

log = logging.getLogger("gflowdist.runtime")


def trim_metrics(path: Path, step: int) -> int:
    """Drop the rows of ``path`` (metrics.jsonl) from step ``step`` on; returns how many were dropped.

    A run resumed from a checkpoint at step K (periodic ``step-K``, or a final one
    whose furthest rank was at K) repeats steps K, K+1, ...: the rows a failed
    generation wrote for them after that checkpoint would otherwise appear twice.
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


class _HashingWriter:
    """A file for ``torch.save`` that hashes what passes and keeps the OS error torch would hide."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: bytes | memoryview) -> int:
        try:
            written = self.raw.write(data)
        except OSError as err:
            self.error = err
            raise
        self.digest.update(data)
        self.size += len(memoryview(data).cast("B"))
        return written

    def flush(self) -> None:
        try:
            self.raw.flush()
        except OSError as err:
            self.error = err
            raise


def save_rank(run_dir: Path, name: str, rank: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Write this rank's part of checkpoint ``name``; returns ``{"bytes": n, "sha256": hex}`` for the manifest.

    Raises :class:`CheckpointError` naming the file and the OS reason when the
    directory or the file cannot be written; nothing half-written is left.
    """
    folder = checkpoint_dir(run_dir, name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(
            f"cannot create checkpoint directory {folder}: {os_reason(err)}", path=str(folder)
        ) from None
    path = folder / rank_file(rank)
    tmp = path.with_suffix(".tmp")
    writer = None
    try:
        with open(tmp, "wb") as raw:
            writer = _HashingWriter(raw)
            torch.save(payload, writer)  # type: ignore[arg-type]  # a file-like object, as torch.save accepts
            writer.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        cause = err if isinstance(err, OSError) else (writer.error if writer is not None else None)
        _remove(tmp)
        if cause is None:
            raise
        raise CheckpointError(
            f"cannot write checkpoint file {path}: {os_reason(cause)}; checkpoint {name} "
            f"stays incomplete (no {MANIFEST}) and is never resumed from",
            path=str(path),
        ) from None
    return {"bytes": writer.size, "sha256": writer.digest.hexdigest()}


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def write_manifest(
    run_dir: Path, name: str, manifest: dict[str, Any], files: Mapping[int, Mapping[str, Any]] | None = None
) -> None:
    """Complete checkpoint ``name``: its ``MANIFEST.json``, with each rank file's size and digest."""
    folder = checkpoint_dir(run_dir, name)
    missing = [r for r in range(manifest["world_size"]) if not (folder / rank_file(r)).exists()]
    if missing:
        raise CheckpointError(f"checkpoint {folder} lacks the files of ranks {missing}", path=str(folder))
    if files is not None:
        manifest = {**manifest, "files": {rank_file(r): dict(files[r]) for r in sorted(files)}}
    tmp = folder / f"{MANIFEST}.tmp"
    try:
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, folder / MANIFEST)
    except OSError as err:
        _remove(tmp)
        raise CheckpointError(
            f"cannot write {folder / MANIFEST}: {os_reason(err)}; checkpoint {name} "
            f"stays incomplete and is never resumed from",
            path=str(folder / MANIFEST),
        ) from None


def candidates(run_dir: Path) -> list[str]:
    """The names of the complete checkpoints (those with a manifest), newest first; not yet checked."""
    return [name for name in checkpoint_names(run_dir) if (checkpoint_dir(run_dir, name) / MANIFEST).exists()]


def latest_complete(run_dir: Path) -> tuple[str, dict[str, Any]] | None:
    """``(name, manifest)`` of the newest checkpoint whose manifest reads; None if there is none.

    Its files are not checked here (see :func:`load_rank`).
    """
    for name in candidates(run_dir):
        try:
            return name, read_manifest(checkpoint_dir(run_dir, name))
        except CheckpointError:
            continue
    return None


def load_rank(run_dir: Path, name: str, rank: int, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """This rank's part of checkpoint ``name``, checked against ``manifest`` (size, SHA-256) first.

    Raises :class:`CheckpointError` naming the file and what is wrong with it.
    """
    path = checkpoint_dir(run_dir, name) / rank_file(rank)
    check_file(path, manifest)
    try:
        payload = torch.load(path, weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path}: not a readable checkpoint ({_torch_reason(err)})", path=str(path)) from None
    if not isinstance(payload, dict) or "runtime" not in payload:
        raise CheckpointError(f"{path}: not a gflowdist checkpoint (no runtime state in it)", path=str(path))
    return payload


def _torch_reason(err: Exception) -> str:
    """What torch said, without its advice to load the file unsafely (weights_only=False)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if any("weights_only" in line for line in lines):
        detail = next((line for line in lines if line.startswith("WeightsUnpickler error:")), "")
        return "its contents are not only tensors and plain values" + (f"; {detail}" if detail else "")
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


@dataclass
class CheckpointSaver:
    """Saves this rank's part of a checkpoint: its role, run state, ledger, RNG states and replay buffer.

    Holds the very objects the loop updates, so a save at any moment writes
    their state at that moment. :meth:`save` returns the file's size and
    digest (what the manifest records).
    """

    run_dir: Path
    rank: int
    role: BaseRole
    state: RunState
    ledger: Ledger
    generator: torch.Generator
    replay: ReplayBuffer | None = None

    def save(self, name: str) -> dict[str, Any]:
        payload = {
            "role": self.role.state_dict(),
            "runtime": self.state.to_dict(),
            "ledger": self.ledger.to_dict(),
            "torch_rng": torch.get_rng_state(),
            "generator": self.generator.get_state(),
        }
        if self.replay is not None:
            payload["replay"] = self.replay.state_dict()
        record = save_rank(self.run_dir, name, self.rank, payload)
        log.info("saved my part of checkpoint %s (%d bytes)", name, record["bytes"])
        return record
