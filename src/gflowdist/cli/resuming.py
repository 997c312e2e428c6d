"""What ``gflowdist run --resume RUN_DIR`` checks before it launches anything.

A checkpoint holds one file per rank, written by a given role; a resumed run
must have the same ranks in the same roles, on the same engine. The rank
count comes from the run directory (``config.yaml``'s ``launch.nprocs``,
which the run recorded), not from the config's default, so
``gflowdist run --resume RUN_DIR`` needs no ``-n``. Refused, in one line
naming each difference: ``-n`` or a ``launch.nprocs`` override that differs
from the run's, ``layout.*`` values that give another layout than the run's
(``layout.trainers=3`` where the run's ``rest`` gave 3 is no change), and an
engine other than the one the run ran on (``--engine``, ``launch.engine``).
Other keys (``run.steps``, ``params.*``, ``faults.*``) may change.

Then the checkpoint, with the checks that need no torch
(``gflowdist.rundir.newest_intact``: manifest, sizes, SHA-256): a run
directory without a complete, intact checkpoint is refused, naming what is
wrong with the newest few, and so is a resume whose ``run.steps`` that
checkpoint has reached already. The ranks check their files again and load
them (:mod:`gflowdist.runtime.resume`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gflowdist.config import REST, Config
from gflowdist.engines import ENGINES, launched_engine
from gflowdist.errors import CheckpointError, ConfigError, LayoutError
from gflowdist.layout import Layout, plan_layout, resolve_counts
from gflowdist.rundir import checkpoint_step, newest_intact, recorded_config, step_of

__all__ = ["resumed_rank_count"]


def resumed_rank_count(run_dir: str, config: Config, *, nprocs_option: int | None, overrides: list[str]) -> int:
    """The run's rank count, once every check above passed; else one :class:`ConfigError`.

    ``config`` is the config the resumed run would use (``RUN_DIR/config.yaml``
    or the config file given, with ``overrides`` applied).
    """
    recorded = recorded_config(run_dir)
    count = recorded.launch.nprocs
    changed = _layout_changes(recorded, config, count)
    if nprocs_option is not None and nprocs_option != count:
        changed.append(f"-n {nprocs_option} (the run has {count} ranks)")
    if any(text.split("=", 1)[0].strip() == "launch.nprocs" for text in overrides) and config.launch.nprocs != count:
        changed.append(f"launch.nprocs = {config.launch.nprocs} (the run has {count} ranks)")
    changed += _engine_change(recorded, config)
    if changed:
        raise ConfigError(
            f"resuming {run_dir} would change the layout or engine its checkpoints were written "
            f"with: {'; '.join(changed)}. A resumed run keeps both; start a new run (without "
            f"--resume) to change them",
            key="--resume",
        )
    try:
        name, manifest = newest_intact(run_dir, count)
    except CheckpointError as err:
        raise ConfigError(str(err), key="--resume") from None
    done = _steps_done(name, manifest, _planned(recorded, count))
    if done is not None and done >= config.run.steps:
        at = f" (step {done})" if done != config.run.steps else ""
        raise ConfigError(
            f"run.steps ({config.run.steps}) already reached by checkpoint {name}{at}: raise "
            f"run.steps (run.steps=N with N > {done}) to continue",
            key="--resume",
        )
    return count


def _layout_changes(recorded: Config, config: Config, count: int) -> list[str]:
    """Each ``layout.*`` value that differs from the run's, if together they give another layout."""
    old, new = recorded.layout.to_dict(), config.layout.to_dict()
    if old == new or _arrangement(recorded, count) == _arrangement(config, count):
        return []
    try:
        gave = vars(resolve_counts(count, recorded.layout))  # what the run's 'rest' gave
    except LayoutError:
        gave = {}
    return [
        f"layout.{key} = {value!r} (the run has {old[key]!r}"
        + (f", which gave {gave[key]})" if old[key] == REST and key in gave else ")")
        for key, value in new.items()
        if old[key] != value
    ]


def _arrangement(config: Config, count: int) -> Any:
    """What the layout config makes of ``count`` ranks (pure arithmetic), or the error it makes.

    A node-local placement needs every rank's host, known only once the ranks
    run: its counts, groups and placement stand for it.
    """
    layout = config.layout
    try:
        if layout.placement == "node-local":
            return resolve_counts(count, layout), layout.agent_groups, layout.placement
        return plan_layout(count, layout).to_dict()
    except LayoutError as err:
        return f"no layout: {err}"


def _planned(config: Config, count: int) -> Layout | None:
    """The run's layout, where it needs no host names."""
    try:
        return plan_layout(count, config.layout) if config.layout.placement != "node-local" else None
    except LayoutError:
        return None


def _engine_change(recorded: Config, config: Config) -> list[str]:
    """The engine this launch would use, if it is not the one the run ran on (``mpi`` or ``torch``)."""
    ran_on, engine = recorded.launch.engine, config.launch.engine
    would = launched_engine(engine).name  # what `gflowdist run` launches
    if ran_on not in ENGINES or ENGINES[ran_on].ranks_are_threads or would == ran_on:
        return []
    runs = f"runs on {would}; " if engine == "auto" else ""
    return [f"launch.engine = {engine} ({runs}the run ran on {ran_on})"]


def _steps_done(name: str, manifest: Mapping[str, Any], layout: Layout | None) -> int | None:
    """The step every trainer of checkpoint ``name`` has done (None if the manifest does not say)."""
    steps = manifest.get("steps")
    if step_of(name) is not None or layout is None or not isinstance(steps, dict):
        return checkpoint_step(name, manifest)  # a periodic checkpoint's: every trainer's
    done = [steps.get(str(rank)) for rank in layout.trainers]
    counted = [step for step in done if isinstance(step, int)]
    return min(counted) if counted and len(counted) == len(done) else None
