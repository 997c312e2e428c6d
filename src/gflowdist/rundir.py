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

Standard library, yaml and :mod:`gflowdist.config` only: the launcher uses it
before it starts anything, without importing torch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml

from gflowdist.config import Config, absolute_ref
from gflowdist.errors import ConfigError
from gflowdist.jobenv import RUN_DIR_VARIABLE

__all__ = ["create_run_dir", "agree_run_dir", "resolved_config", "write_config", "recorded_config", "CONFIG_FILE"]

CONFIG_FILE = "config.yaml"
_MAX_SUFFIX = 1000


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
    raise ConfigError(f"{_MAX_SUFFIX} run directories {name}-{stamp}[-k] exist already in {base}",
                      key="run.out_dir")


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
    if engine in ("mpi", "torch"):
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
