"""What ``gflowdist run --resume RUN_DIR`` keeps: the layout the run's checkpoints were written with.

A checkpoint holds one file per rank, written by a given role; a resumed run
must have the same ranks in the same roles. The rank count comes from the
run directory (``config.yaml``'s ``launch.nprocs``, which the run recorded),
not from the config's default, so ``gflowdist run --resume RUN_DIR`` needs
no ``-n``. Anything that would change the layout (``-n``, a
``launch.nprocs`` override or a ``layout.*`` value that differs from the
run's) is refused, naming each difference; other keys (``run.steps``,
``params.*``, ``faults.*``) may change.
"""

from __future__ import annotations

from gflowdist.config import Config
from gflowdist.errors import ConfigError
from gflowdist.rundir import recorded_config

__all__ = ["resumed_rank_count"]


def resumed_rank_count(run_dir: str, config: Config, *, nprocs_option: int | None, overrides: list[str]) -> int:
    """The run's rank count; :class:`ConfigError` if ``config`` or the options would change its layout."""
    recorded = recorded_config(run_dir)
    count = recorded.launch.nprocs
    changed = [f"layout.{key} = {value!r} (the run has {recorded.layout.to_dict()[key]!r})"
               for key, value in config.layout.to_dict().items() if recorded.layout.to_dict()[key] != value]
    if nprocs_option is not None and nprocs_option != count:
        changed.append(f"-n {nprocs_option} (the run has {count} ranks)")
    if any(text.split("=", 1)[0].strip() == "launch.nprocs" for text in overrides) and config.launch.nprocs != count:
        changed.append(f"launch.nprocs = {config.launch.nprocs} (the run has {count} ranks)")
    if changed:
        raise ConfigError(f"resuming {run_dir} would change the layout its checkpoints were written with: "
                          f"{'; '.join(changed)}. A resumed run keeps its layout; start a new run (without "
                          f"--resume) to change it", key="--resume")
    return count
