"""The run directory: created exclusively, and holding everything a resume needs.

``runs/<name>-<timestamp>/`` is made with ``mkdir`` that fails if the
directory exists; a second job started in the same second with the same
``run.out_dir`` gets ``<name>-<timestamp>-1`` (then ``-2``, ...), so two jobs
never share one. ``gflowdist run`` creates it before it launches the ranks
and names it in ``GFLOWDIST_RUN_DIR``; ranks started by another launcher
(srun, torchrun) have rank 0 create it and share its name.

``config.yaml`` in it is the config the run used, resolved so that
``gflowdist run --resume RUN_DIR`` works from any directory: role files as
absolute paths, ``launch.nprocs`` the number of ranks the run had,
``launch.engine`` the engine it ran on.

Its checkpoints' files, as far as they can be checked without torch
(:mod:`gflowdist.runtime.checkpoints` writes and loads them):
``checkpoints/<name>/`` holds one ``rank-NNNNN.pt`` per rank and, once every
file exists, ``MANIFEST.json`` with each file's size and SHA-256. A directory
without a manifest is a partial checkpoint (a save that never finished: a
full disk, a kill). :func:`newest_intact` is the launcher's choice of the
checkpoint to resume from: the newest one whose manifest reads and whose
files all have the size and digest it lists; each rank checks its own file
again, and loads it (:mod:`gflowdist.runtime.resume`).

Standard library, yaml and :mod:`gflowdist.config` only: the launcher uses it
before it starts anything, without importing torch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gflowdist.config import Config, absolute_ref
from gflowdist.engines import ENGINES
from gflowdist.errors import CheckpointError, ConfigError
from gflowdist.jobenv import RUN_DIR_VARIABLE

__all__ = [
    "create_run_dir",
    "agree_run_dir",
    "resolved_config",
    "write_config",
    "recorded_config",
    "CONFIG_FILE",
    "MANIFEST",
    "checkpoint_name",
    "checkpoint_dir",
    "rank_file",
    "os_reason",
    "checkpoint_names",
    "read_manifest",
    "check_file",
    "step_of",
    "checkpoint_step",
    "newest_intact",
]

CONFIG_FILE = "config.yaml"
MANIFEST = "MANIFEST.json"
_MAX_SUFFIX = 1000
_CHECKPOINT_NAME = re.compile(r"^gen-(\d{4})-(?:step-(\d{9})|final)$")
_CHUNK = 1 << 20
#: how many refused checkpoints a refusal to resume names, newest first
_NAMED = 3


def create_run_dir(out_dir: str | os.PathLike[str], name: str) -> Path:
    """A new, empty ``<out_dir>/<name>-<timestamp>[-k]``, created here and by no other job."""
    base = Path(out_dir)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create {base}: {err.strerror}", key="run.out_dir") from None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(_MAX_SUFFIX):
        path = base / (f"{name}-{stamp}" if k == 0 else f"{name}-{stamp}-{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as err:
            raise ConfigError(f"cannot create {path}: {err.strerror}", key="run.out_dir") from None
        return path
    raise ConfigError(f"{_MAX_SUFFIX} run directories {name}-{stamp}[-k] exist already in {base}", key="run.out_dir")


def agree_run_dir(world, config: Config, resume_dir: str | None) -> Path:
    """Collective: the run directory of this job, the same on every rank.

    ``--resume``'s directory; else the one the launcher created; else rank 0
    creates one and tells the others.
    """
    if resume_dir is not None:
        return Path(resume_dir)
    given = os.environ.get(RUN_DIR_VARIABLE)
    if given:
        return Path(given)
    mine = str(create_run_dir(config.run.out_dir, config.run.name)) if world.rank == 0 else ""
    return Path(world.all_gather_bytes(mine.encode())[0].decode())


def resolved_config(config: Config, world_size: int, engine: str) -> dict:
    """``config`` as a dict a resume can use from anywhere (see the module docstring)."""
    tree = config.to_dict()
    for role, ref in tree["roles"].items():
        if ref is not None:
            tree["roles"][role] = absolute_ref(ref, key=f"roles.{role}", file=config.file)
    tree["launch"]["nprocs"] = world_size
    if engine in ENGINES and not ENGINES[engine].ranks_are_threads:  # a world of one or threads: any engine
        tree["launch"]["engine"] = engine
    return tree


def write_config(run_dir: Path, config: Config, world_size: int, engine: str) -> None:
    """``config.yaml``: the resolved config (:func:`resolved_config`)."""
    text = yaml.safe_dump(resolved_config(config, world_size, engine), sort_keys=False)
    tmp = Path(run_dir) / f"{CONFIG_FILE}.tmp"
    tmp.write_text(text)
    os.replace(tmp, Path(run_dir) / CONFIG_FILE)


def recorded_config(run_dir: str | os.PathLike[str], overrides=()) -> Config:
    """The config a run recorded in its directory (``config.yaml``), with ``overrides`` applied.

    A missing file is a :class:`ConfigError` asking whether ``run_dir`` is a run directory.
    """
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise ConfigError(f"{path} not found: is {run_dir} a gflowdist run directory?", key="--resume")
    return Config.from_yaml(path, overrides=overrides)


# -- checkpoints, as far as they can be checked without torch ---------------------------------------------------


def checkpoint_name(generation: int, step: int | None = None) -> str:
    """``gen-0003-step-000000050`` (periodic) or ``gen-0003-final``."""
    return f"gen-{generation:04d}-final" if step is None else f"gen-{generation:04d}-step-{step:09d}"


def checkpoint_dir(run_dir: str | os.PathLike[str], name: str) -> Path:
    return Path(run_dir) / "checkpoints" / name


def rank_file(rank: int) -> str:
    """The file name of a rank's part: ``rank-00002.pt``."""
    return f"rank-{rank:05d}.pt"


def os_reason(err: OSError) -> str:
    """``No space left on device [ENOSPC]``: the OS's words and the errno's name."""
    code = err.errno
    if code is None:
        return str(err)
    return f"{os.strerror(code)} [{errno.errorcode.get(code, code)}]"


def _order(name: str) -> tuple[int, int, int] | None:
    match = _CHECKPOINT_NAME.match(name)
    if match is None:
        return None
    generation, step = match.groups()
    return int(generation), 1 if step is None else 0, int(step or 0)


def checkpoint_names(run_dir: str | os.PathLike[str]) -> list[str]:
    """Every checkpoint directory of ``run_dir``, newest first: complete ones and partial ones (no manifest)."""
    folder = Path(run_dir) / "checkpoints"
    found = (
        [(order, path.name) for path in folder.iterdir() if path.is_dir() and (order := _order(path.name)) is not None]
        if folder.is_dir()
        else []
    )
    return [name for _, name in sorted(found, reverse=True)]


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint in ``folder``; :class:`CheckpointError` naming it if absent or unreadable."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder}: no {MANIFEST}, a partial checkpoint (its save never finished)", path=str(folder)
        ) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read: {os_reason(err)}", path=str(path)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not a manifest (not UTF-8 JSON: {err})", path=str(path)) from None
    fields = ("world_size", "generation")
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), int) for k in fields):
        raise CheckpointError(f"{path}: not a manifest (needs integers {' and '.join(fields)})", path=str(path))
    files = manifest.get("files")
    if files is not None and not _valid_files(files):
        raise CheckpointError(
            f"{path}: not a manifest ('files' must map each file to its bytes and sha256)", path=str(path)
        )
    return manifest


def _valid_files(files: Any) -> bool:
    return isinstance(files, dict) and all(
        isinstance(v, dict) and isinstance(v.get("bytes"), int) and isinstance(v.get("sha256"), str)
        for v in files.values()
    )


def check_file(path: Path, manifest: Mapping[str, Any]) -> None:
    """``path`` (a rank's file) is present, listed, and has the size and SHA-256 ``manifest`` lists.

    Raises :class:`CheckpointError` naming the file and what is wrong with it.
    A manifest of an older gflowdist (no ``files``) allows only the check that the file is there.
    """
    expected = (manifest.get("files") or {}).get(path.name)
    if "files" in manifest and expected is None:
        raise CheckpointError(f"{path}: not listed in the checkpoint's {MANIFEST}", path=str(path))
    try:
        size, digest = _size_and_digest(path)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing", path=str(path)) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read: {os_reason(err)}", path=str(path)) from None
    if expected is not None and size != expected["bytes"]:
        what = "truncated" if size < expected["bytes"] else "too long"
        raise CheckpointError(f"{path}: {what}: {size} bytes, the manifest says {expected['bytes']}", path=str(path))
    if expected is not None and digest != expected["sha256"]:
        raise CheckpointError(
            f"{path}: its SHA-256 is not the manifest's: the file changed after it was written (corrupt)",
            path=str(path),
        )


def _size_and_digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def step_of(name: str) -> int | None:
    """The step of a periodic checkpoint's name (``gen-0003-step-000000050`` -> 50); None for a final one."""
    head, _, step = name.rpartition("-step-")
    return int(step) if head and step.isdigit() else None


def checkpoint_step(name: str, manifest: Mapping[str, Any]) -> int | None:
    """The step a run resumed from checkpoint ``name`` continues from (steps done; None if unknown).

    A periodic checkpoint's is in its name (``gen-0000-step-000000050``: 50);
    a final one's is the furthest step of its manifest's ``steps`` (each rank's).
    """
    if (step := step_of(name)) is not None:
        return step
    steps = manifest.get("steps")
    values = [v for v in steps.values() if isinstance(v, int)] if isinstance(steps, dict) else []
    return max(values) if values else None


def newest_intact(run_dir: str | os.PathLike[str], world_size: int) -> tuple[str, dict[str, Any]]:
    """``(name, manifest)`` of the newest checkpoint whose manifest reads and whose files are all intact.

    Needs no torch: the files are checked against the manifest (size, SHA-256), not loaded. Raises
    :class:`CheckpointError` when there is none, in one line naming what is wrong with the newest few;
    and when a checkpoint was written by other than ``world_size`` ranks (the run's own count).
    """
    folder = Path(run_dir) / "checkpoints"
    names = checkpoint_names(run_dir)
    if not names:
        raise CheckpointError(
            f"no checkpoint in {folder}: the run ended before its first checkpoint; start it again without --resume",
            path=str(folder),
        )
    refused = []
    for name in names:
        try:
            manifest = read_manifest(folder / name)
        except CheckpointError as err:
            refused.append([str(err)])
            continue
        if manifest["world_size"] != world_size:
            raise CheckpointError(
                f"checkpoint {folder / name} was written by {manifest['world_size']} ranks, "
                f"but the run's config.yaml says launch.nprocs: {world_size}",
                path=str(folder),
            )
        problems = []
        for rank in range(world_size):
            try:
                check_file(folder / name / rank_file(rank), manifest)
            except CheckpointError as err:
                problems.append(str(err))
        if not problems:
            return name, manifest
        refused.append(problems)
    named = [_briefly(problems).replace(f"{folder}/", "") for problems in refused[:_NAMED]]
    older = f"; and {len(refused) - _NAMED} older, none intact either" if len(refused) > _NAMED else ""
    raise CheckpointError(f"no complete, intact checkpoint in {folder}: {'; '.join(named)}{older}", path=str(folder))


def _briefly(problems: list[str]) -> str:
    """The first problems of a checkpoint, and how many files more are damaged."""
    more = len(problems) - _NAMED
    return "; ".join(problems[:_NAMED]) + (f"; and {more} more damaged file{'s' * (more > 1)}" if more > 0 else "")
