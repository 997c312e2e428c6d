"""``gflowdist run CONFIG [key.path=value ...] [-n N] [--engine mpi|torch] [--resume RUN_DIR] [--record]
[--max-restarts N]``.

Outside a job, the command re-launches itself on N ranks: under the
``mpiexec`` next to this Python (MPICH from PyPI), the one named by
``launch.mpiexec``, or on PATH; with ``--engine torch`` it spawns N gloo
workers with a rendezvous on a free loopback port. Inside a job (mpiexec,
srun, torchrun) it just runs. Ctrl-C (SIGINT) or SIGTERM is forwarded to every
rank: they finish their step, drain, checkpoint and write the report. A second
signal is only counted (one signal to a process group often arrives twice);
a third forces an exit. If the launcher itself dies, however, its job ends
too (:mod:`gflowdist.lifeline`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, cast

from gflowdist.cli.arguments import (
    HelpFormatter,
    add_config_arguments,
    add_rank_count,
    restart_count,
    split_late_options,
)
from gflowdist.cli.rank_end import finalize_mpi, freeze_for_exit, run_then_end
from gflowdist.cli.restarts import Ended, keep_going
from gflowdist.cli.stderr_relay import StderrRelay
from gflowdist.cli.supervise import end_progress_line, failure_file, final_saved, say, supervise, unexplained
from gflowdist.cli.warm_parent import start_for_launch
from gflowdist.engines import CHOICES, TORCH, launched_engine
from gflowdist.jobenv import (
    CONSOLE_VARIABLE,
    FAILURE_FILE_VARIABLE,
    IN_MPI_VARIABLE,
    KEEPER_BOUND_VARIABLE,
    LAUNCH_CONFIG_VARIABLE,
    RESTART_VARIABLE,
    RUN_DIR_VARIABLE,
    STDERR_RELAY_VARIABLE,
    find_mpiexec,
    free_port,
    in_mpi_job,
    in_torch_job,
)
from gflowdist.lifeline import Lifeline
from gflowdist.process_tree import become_subreaper
from gflowdist.runtime.settings import Settings

__all__ = ["add_parser"]


_DESCRIPTION = """\
Run the job a YAML config describes. Outside a job it starts N ranks itself:
under mpiexec (launch.mpiexec, else $GFLOWDIST_MPIEXEC, else the one next to
this Python, else the one on PATH), or with --engine torch as N gloo
processes. Inside a job (mpiexec, srun, torchrun) it just runs.

Before starting anything it checks that the layout fits the rank count, that
every role class resolves, imports and implements what its role needs, and
that the launcher runs: each mistake is one line and exit status 2.
Ctrl-C or SIGTERM reaches every rank: they finish their step, drain,
checkpoint and write the report. A second Ctrl-C or SIGTERM is only counted;
the third forces an exit (every process of the job killed, nothing more
saved). If this process is killed, its job ends within faults.peer_timeout_s."""

_EXAMPLES = """\
examples:
  gflowdist run config.yaml
  gflowdist run config.yaml -n 4 run.steps=1000 layout.buffers=2
  gflowdist run config.yaml --set run.steps=1000        (the same as run.steps=1000)
  gflowdist run --resume runs/arms-20260101-120000
  gflowdist run config.yaml --record          (then: gflowdist replay RUN_DIR)"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a job described by a YAML config",
        description=_DESCRIPTION,
        epilog=_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_config_arguments(
        parser, optional=True, config_help="YAML config (may be omitted with --resume: the run's own config.yaml)"
    )
    _add_options(parser)
    parser.set_defaults(handler=run)


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_rank_count(parser, "number of ranks (default: launch.nprocs); -np N works too")
    parser.add_argument(
        "--engine",
        choices=list(CHOICES),
        help="override launch.engine (local: every rank a thread of this process, for debuggers)",
    )
    parser.add_argument(
        "--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest intact checkpoint"
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="record every rank's choices that depend on timing (run.record=true), so that "
        "gflowdist replay RUN_DIR can run it again to the bit",
    )
    parser.add_argument(
        "--max-restarts",
        type=restart_count,
        metavar="N",
        help="restart a failed job up to N times from its newest intact checkpoint (overrides faults.max_restarts)",
    )


def _load(args):
    from gflowdist.config import Config
    from gflowdist.errors import ConfigError
    from gflowdist.rundir import recorded_config

    overrides = split_late_options(args, "gflowdist run", _add_options)
    handed = os.environ.get(LAUNCH_CONFIG_VARIABLE)
    if handed and (in_mpi_job() or in_torch_job()):  # a rank: the config its launcher checked, read once
        from gflowdist.config.handoff import read_launch_config

        return read_launch_config(handed), args.config, overrides
    config_path = args.config
    if config_path is not None and "=" in config_path and not Path(config_path).exists():
        overrides.insert(0, config_path)  # `gflowdist run --resume DIR key=value`
        config_path = None
    if args.engine:
        overrides.append(f"launch.engine={args.engine}")
    if args.record:
        if args.resume:
            raise ConfigError(
                "--record starts a run from its beginning, which a replay repeats; it cannot "
                "record a resumed run (--resume): record a new one",
                key="--record",
            )
        overrides.append("run.record=true")
    if args.resume:  # a recording replays a run from its start: a resumed run records nothing
        overrides += ["run.record=false", "run.replay_of=null"]
    if args.max_restarts is not None:
        overrides.append(f"faults.max_restarts={args.max_restarts}")
    if config_path is None:
        if args.resume is None:
            raise ConfigError("give a config file (or --resume RUN_DIR)", key="CONFIG")
        config = recorded_config(args.resume, overrides)  # the run's own config.yaml
        return config, config.file, overrides
    return Config.from_yaml(config_path, overrides=overrides), config_path, overrides


def run(args: argparse.Namespace) -> int:
    config, config_path, overrides = _load(args)  # a bad config fails here, before anything heavy loads
    if in_mpi_job():
        from gflowdist.cli.rank_keeper import keep

        # this process becomes the rank's keeper; the rank continues in a child
        keep(bound_s=Settings.of(config).keeper_bound_s)
        _watch_launcher(config, args.resume)
        # an MPI rank ends through the interpreter's exit, not run_then_end: see gflowdist.cli.rank_end
        try:
            return _run_here(config, args.resume)
        finally:
            freeze_for_exit()  # an exit that does not walk torch's objects again (gflowdist.cli.rank_end)
    if in_torch_job():
        from gflowdist.cli.rank_keeper import keep_gloo_rank

        keep_gloo_rank(bound_s=Settings.of(config).keeper_bound_s)  # with a warm parent, the rank is its fork
        _watch_launcher(config, args.resume)
        run_then_end(_run_here, config, args.resume)
    nprocs = args.nprocs if args.nprocs is not None else config.launch.nprocs
    if args.resume:
        from gflowdist.cli.resuming import resumed_rank_count

        nprocs = resumed_rank_count(args.resume, config, nprocs_option=args.nprocs, overrides=overrides)
    launcher = _check_before_launch(config, nprocs, from_option=args.nprocs is not None)
    engine = launched_engine(config.launch.engine)
    if engine.ranks_are_threads:
        from gflowdist.runtime.in_process import run_in_process

        return run_in_process(config, nprocs, resume_dir=args.resume)
    argv = ["-m", "gflowdist", "run", config_path, *overrides]
    if args.resume:
        argv += ["--resume", args.resume]
    if launcher is None and engine.uses_mpiexec:  # one rank: this process is the job
        return _run_here(config, args.resume)
    run_dir = args.resume
    if not args.resume:  # the launcher makes the run directory: no other job can take it
        from gflowdist.rundir import create_run_dir

        run_dir = str(create_run_dir(config.run.out_dir, config.run.name))
    from gflowdist.config.handoff import write_launch_config

    handed = write_launch_config(run_dir, config)
    lifeline = Lifeline()  # whatever ends this process, the job ends within faults.peer_timeout_s

    attempts: list[tuple[Ended, float]] = []

    def launch(argv: list[str], extra: dict) -> Ended:
        env = dict(_child_env(run_dir), **extra, **lifeline.env(), **{LAUNCH_CONFIG_VARIABLE: str(handed)})
        env[KEEPER_BOUND_VARIABLE] = str(Settings.of(config).keeper_bound_s)  # a warm start's keepers: at once
        began = time.time()
        if engine is TORCH:
            grace = Settings.of(config).launcher_grace_s
            ended = _spawn_torch(
                nprocs,
                argv,
                env,
                report_grace_s=grace,
                stop_grace_s=config.faults.preempt_grace_s,
                fds=lifeline.fds,
                saved=lambda: final_saved(run_dir, began),
                warm_start=config.launch.warm_start,
                warm_imports=config.launch.warm_imports,
            )
        else:
            ended = _launch_mpi(
                nprocs, argv, env, config, launcher, fds=lifeline.fds, saved=lambda: final_saved(run_dir, began)
            )
        attempts.append((ended, began))
        judged = ended.judged_by(Path(run_dir), since=began)
        if judged.code != 0 and judged.failure is None and not judged.interrupted:
            end_progress_line()
            sys.stderr.write(unexplained(judged) + f"\ngflowdist: the ranks' logs: {Path(run_dir) / 'logs'}\n")
            sys.stderr.flush()
        return judged

    code, started = 1, time.time()
    try:
        ended = launch(argv, {} if args.resume else {RUN_DIR_VARIABLE: run_dir})
        resume_argv = ["-m", "gflowdist", "run", config_path, *overrides, "--resume", run_dir]
        code = keep_going(
            ended,
            max_restarts=config.faults.max_restarts,
            delay_s=config.faults.restart_delay_s,
            run_dir=Path(run_dir),
            relaunch=lambda record: launch(resume_argv, {RESTART_VARIABLE: json.dumps(record)}),
        )
        _say_how_to_resume(Path(run_dir), *attempts[-1], nprocs, config.faults.preempt_grace_s)
        if code != 0:
            from gflowdist.runtime.failures import tell_where

            tell_where(Path(run_dir), since=started)
        return code
    finally:
        handed.unlink(missing_ok=True)
        if code != 0 and not args.resume:
            _remove_if_empty(run_dir)


def _watch_launcher(config, resume: str | None) -> None:
    """On a rank: end within faults.peer_timeout_s once the launcher that started it is gone (gflowdist.lifeline)."""
    from gflowdist.lifeline import watch

    rank = os.environ.get("PMI_RANK") or os.environ.get("RANK") or "?"
    run_dir = resume or os.environ.get(RUN_DIR_VARIABLE)
    handed = os.environ.get(LAUNCH_CONFIG_VARIABLE)
    leftovers = (handed,) if handed else ()
    watch(run_dir, who=f"rank {rank} (pid {os.getpid()})", bound_s=config.faults.peer_timeout_s, leftovers=leftovers)


def _say_how_to_resume(run_dir: Path, ended: Ended, began: float, nprocs: int, grace_s: float) -> None:
    """After Ctrl-C or SIGTERM (a preemption): whether the stop fit faults.preempt_grace_s, and the command that
    resumes the run as the last line, unless the collector wrote the run's end (and said it) or there is no
    intact checkpoint to resume from (then why)."""
    from gflowdist.errors import CheckpointError
    from gflowdist.rundir import newest_intact

    if not ended.interrupted:
        return
    if ended.overran:
        say(
            f"gflowdist: the job did not stop within faults.preempt_grace_s = {grace_s:g} s and was killed: "
            "the checkpoint it was writing is incomplete, and --resume uses the newest intact one"
        )
    try:
        concluded = (run_dir / "ledger.json").stat().st_mtime >= began
    except OSError:
        concluded = False
    if concluded and not ended.overran:
        return
    try:
        name, _ = newest_intact(run_dir, nprocs)
    except CheckpointError as err:
        say(f"gflowdist: stopped, not resumable: {err}")
        return
    sys.stdout.flush()
    print(f"gflowdist: interrupted; resume with: gflowdist run --resume {run_dir} (from checkpoint {name})", flush=True)


def _remove_if_empty(run_dir: str) -> None:
    """Remove the run directory this launch made when the job failed before any rank wrote into it."""
    try:
        os.rmdir(run_dir)  # only an empty directory: whatever a rank wrote stays
    except OSError:
        pass


def _check_before_launch(config, nprocs: int, *, from_option: bool):
    """Everything :mod:`gflowdist.cli.preflight` checks; the mpiexec to use (None: no mpiexec)."""
    from gflowdist.cli import preflight

    source = f"-n {nprocs}" if from_option else f"launch.nprocs = {nprocs}"
    layout = preflight.check_layout_fits(config, nprocs, source=source)
    preflight.check_extras(config)
    preflight.check_roles_named(config, layout)
    resolved = preflight.resolve_roles(config)
    uses_mpiexec = nprocs > 1 and launched_engine(config.launch.engine).uses_mpiexec
    launcher = preflight.check_launcher(config, find_mpiexec) if uses_mpiexec else None
    if launcher is not None:
        preflight.check_launcher_spawns(config, launcher)
    judge_devices = preflight.devices_judged_here(config, nprocs)
    if judge_devices:
        gpus = preflight.check_roles_import(config, resolved, in_child=nprocs > 1, count_cuda=True)
        preflight.check_devices(config, nprocs, gpus)
    else:
        preflight.check_roles_import(config, resolved, in_child=nprocs > 1)
    return launcher


def _run_here(config, resume) -> int:
    import gflowdist.runtime.job as job
    from gflowdist.comm.select import release_world_comm

    job.run_job(config, resume_dir=resume)  # bounds the end of this process (runtime.process.end_within)
    release_world_comm()  # collective: every rank that returns here got through the same last step
    finalize_mpi()  # now, while the bound on this process's end holds (gflowdist.cli.rank_end)
    return 0


def _child_env(run_dir: str) -> dict:
    env = dict(os.environ)
    env[FAILURE_FILE_VARIABLE] = failure_file(run_dir)
    env[CONSOLE_VARIABLE] = _console()
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _console() -> str:
    """What the ranks' progress line is printed on: ``tty:COLUMNS`` (this stdout is a terminal) or ``pipe``."""
    import shutil

    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return f"tty:{shutil.get_terminal_size().columns}" if tty else "pipe"


def _launch_mpi(
    nprocs: int, argv: list[str], env: dict, config, launcher, fds: tuple[int, ...] = (), saved=None
) -> Ended:
    # Hydra kills every rank the moment one dies, before anyone can say which one
    # it was; gflowdist detects the loss itself (heartbeats), names the rank, role
    # and host, and then aborts the job.
    cleanup = ["-disable-auto-cleanup"] if launcher.is_hydra else []
    cmd = [launcher.path, "-n", str(nprocs), *cleanup, *config.launch.mpiexec_args, sys.executable, *argv]
    env = dict(env, **{IN_MPI_VARIABLE: "1", STDERR_RELAY_VARIABLE: "1"})
    become_subreaper()
    with contextlib.ExitStack() as stack:
        # this host's ranks: forks
        helpers = start_for_launch(stack, config.launch.warm_start, nprocs, env, config.launch.warm_imports)
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True, pass_fds=fds)
        relay = StderrRelay(cast(IO[bytes], proc.stderr))  # stderr=PIPE: Popen made the pipe (its type allows None)
        report_grace_s = Settings.of(config).launcher_grace_s
        grace_s = config.faults.preempt_grace_s
        return supervise(
            [proc], report_grace_s=report_grace_s, relay=relay, stop_grace_s=grace_s, saved=saved, helpers=helpers
        )


def _spawn_torch(
    nprocs: int,
    argv: list[str],
    env: dict,
    *,
    report_grace_s: float,
    stop_grace_s: float = 60.0,
    fds: tuple[int, ...] = (),
    saved=None,
    warm_start: bool | None = False,
    warm_imports: tuple[str, ...] = (),
) -> Ended:
    env = dict(env)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nprocs))
    become_subreaper()
    with contextlib.ExitStack() as stack:
        helpers = start_for_launch(stack, warm_start, nprocs, env, warm_imports)  # each rank: a fork (its keeper stays)
        procs = []
        for rank in range(nprocs):
            rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            # every rank's stdout passes, as under mpiexec: the collector (the coordinator, often the last
            # rank) prints the run's lines, and a rank that prints nothing costs nothing
            procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, start_new_session=True, pass_fds=fds))
        return supervise(procs, report_grace_s=report_grace_s, stop_grace_s=stop_grace_s, saved=saved, helpers=helpers)
