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
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gflowdist.cli.arguments import HelpFormatter, add_config_arguments, rank_count, restart_count, split_late_options
from gflowdist.cli.restarts import Ended, keep_going
from gflowdist.cli.stderr_relay import StderrRelay, choose_failure
from gflowdist.jobenv import (
    CONSOLE_VARIABLE,
    FAILURE_FILE_VARIABLE,
    IN_MPI_VARIABLE,
    LAUNCH_CONFIG_VARIABLE,
    RESTART_VARIABLE,
    RUN_DIR_VARIABLE,
    find_mpiexec,
    free_port,
    in_mpi_job,
    in_torch_job,
)
from gflowdist.lifeline import Lifeline
from gflowdist.process_tree import DescendantTracker, become_subreaper, kill_group

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
    parser.add_argument("-n", "--nprocs", type=rank_count, metavar="N", help="number of ranks (default: launch.nprocs)")
    parser.add_argument(
        "--engine",
        choices=["auto", "mpi", "torch", "local"],
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
        keep(bound_s=config.faults.peer_timeout_s + _KEEPER_MARGIN_S)
        _watch_launcher(config, args.resume)
        return _run_here(config, args.resume)
    if in_torch_job():
        _watch_launcher(config, args.resume)
        return _run_here(config, args.resume)
    nprocs = args.nprocs if args.nprocs is not None else config.launch.nprocs
    if args.resume:
        from gflowdist.cli.resuming import resumed_rank_count

        nprocs = resumed_rank_count(args.resume, config, nprocs_option=args.nprocs, overrides=overrides)
    launcher = _check_before_launch(config, nprocs, from_option=args.nprocs is not None)
    if config.launch.engine == "local":
        from gflowdist.launch.in_process import run_in_process

        return run_in_process(config, nprocs, resume_dir=args.resume)
    argv = ["-m", "gflowdist", "run", config_path, *overrides]
    if args.resume:
        argv += ["--resume", args.resume]
    if launcher is None and config.launch.engine != "torch":
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
        env = dict(_child_env(), **extra, **lifeline.env(), **{LAUNCH_CONFIG_VARIABLE: str(handed)})
        began = time.time()
        if config.launch.engine == "torch":
            grace = 2 * config.faults.peer_timeout_s + 10.0
            ended = _spawn_torch(nprocs, argv, env, report_grace_s=grace, fds=lifeline.fds)
        else:
            ended = _launch_mpi(nprocs, argv, env, config, launcher, fds=lifeline.fds)
        attempts.append((ended, began))
        return ended.judged_by(Path(run_dir), since=began)

    code = 1
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
        _say_how_to_resume(Path(run_dir), *attempts[-1])
        return code
    finally:
        handed.unlink(missing_ok=True)
        if code != 0 and not args.resume:
            _remove_if_empty(run_dir)


#: How much longer than faults.peer_timeout_s a keeper lets its rank run after the launcher died (the rank's own
#: bound is faults.peer_timeout_s: see gflowdist.lifeline).
_KEEPER_MARGIN_S = 2.0


def _watch_launcher(config, resume: str | None) -> None:
    """On a rank: end within faults.peer_timeout_s once the launcher that started it is gone (gflowdist.lifeline)."""
    from gflowdist.lifeline import watch

    rank = os.environ.get("PMI_RANK") or os.environ.get("RANK") or "?"
    run_dir = resume or os.environ.get(RUN_DIR_VARIABLE)
    watch(run_dir, who=f"rank {rank} (pid {os.getpid()})", bound_s=config.faults.peer_timeout_s)


def _say_how_to_resume(run_dir: Path, ended: Ended, began: float) -> None:
    """After Ctrl-C or SIGTERM: the command that resumes the run, as the last line, unless the collector
    wrote the run's end (and said it) or there is no checkpoint to resume from."""
    if not ended.interrupted:
        return
    try:
        concluded = (run_dir / "ledger.json").stat().st_mtime >= began
    except OSError:
        concluded = False
    if concluded or not any((run_dir / "checkpoints").glob("*/MANIFEST.json")):
        return
    sys.stdout.flush()
    print(f"gflowdist: interrupted; resume with: gflowdist run --resume {run_dir}", flush=True)


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
    uses_mpiexec = nprocs > 1 and config.launch.engine not in ("torch", "local")
    launcher = preflight.check_launcher(config, find_mpiexec) if uses_mpiexec else None
    judge_devices = preflight.devices_judged_here(config, nprocs)
    gpus = preflight.check_roles_import(config, resolved, in_child=nprocs > 1, count_cuda=judge_devices)
    if judge_devices:
        preflight.check_devices(config, nprocs, gpus)
    return launcher


def _run_here(config, resume) -> int:
    import gflowdist.runtime.job as job
    from gflowdist.comm.select import release_world_comm

    job.run_job(config, resume_dir=resume)  # bounds the end of this process (runtime.process.end_within)
    release_world_comm()  # collective: every rank that returns here got through the same last step
    _finalize_mpi()
    return 0


def _finalize_mpi() -> None:
    """MPI_Finalize now, while the bound on this process's end still holds (an MPI rank only).

    mpi4py would call it at the very end of the interpreter's shutdown, after
    Python has cancelled faulthandler's timer, and with a lost rank it never
    returns (``gflowdist.runtime.process.end_within``).
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def _child_env() -> dict:
    env = dict(os.environ)
    env[FAILURE_FILE_VARIABLE] = _failure_file()
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


_FAILURE_FILES: list[str] = []


def _failure_file() -> str:
    if not _FAILURE_FILES:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="gflowdist-failure-", suffix=".txt")
        os.close(fd)
        _FAILURE_FILES.append(path)
    return _FAILURE_FILES[0]


def _failure_messages() -> list[str]:
    """The complete entries of the failure file so far (each ends with a NUL), in the order written."""
    messages = []
    for path in _FAILURE_FILES:
        try:
            with open(path) as f:
                entries = f.read().split("\0")[:-1]  # the last piece is unfinished or empty
        except FileNotFoundError:
            continue
        messages += [m.strip() for m in entries if m.strip()]
    return messages


def _report_failure(code: int, relay: StderrRelay | None = None) -> str | None:
    """Print the rank failure to believe (MPI's abort may have eaten the rank's own stderr).

    With a stderr relay, that is the first entry whose first line came through
    mpiexec (a rank on the launcher's side of any partition); else the first.
    """
    message = choose_failure(_failure_messages(), relay)
    for path in _FAILURE_FILES:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _FAILURE_FILES.clear()
    if code != 0 and message:
        sys.stderr.write(f"gflowdist: the job failed (exit {code}):\n{message}\n")
        sys.stderr.flush()
    return message if code != 0 else None


def _failure_reported(relay: StderrRelay | None) -> bool:
    """A rank has written a failure we will believe (see :func:`_report_failure`)."""
    messages = _failure_messages()
    if relay is None:
        return bool(messages)
    return any(relay.seen(m.splitlines()[0]) for m in messages)


def _wait_for_orphans(grace_s: float, tracker: DescendantTracker, relay: StderrRelay | None = None) -> None:
    """Let ranks that outlived their launcher report, reaping them as they exit.

    Ends after ``grace_s``, when none of the job's processes runs any more, or
    as soon as a failure has been reported (ranks cut off by a partition never
    report, and the rest of the job is killed anyway).
    """
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not _failure_reported(relay):
        _reap_children()
        if not tracker.running():
            return
        time.sleep(0.1)


def _reap_children() -> None:
    """Reap adopted orphans that have exited."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _reap_leftovers(tracker: DescendantTracker) -> None:
    """Kill and reap every process of the job still alive (orphaned ranks were re-parented to us)."""
    for pid in tracker.kill():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # not our direct child (its own parent reaps it)
            pass


def _launch_mpi(nprocs: int, argv: list[str], env: dict, config, launcher, fds: tuple[int, ...] = ()) -> Ended:
    # Hydra kills every rank the moment one dies, before anyone can say which one
    # it was; gflowdist detects the loss itself (heartbeats), names the rank, role
    # and host, and then aborts the job.
    cleanup = ["-disable-auto-cleanup"] if launcher.is_hydra else []
    cmd = [launcher.path, "-n", str(nprocs), *cleanup, *config.launch.mpiexec_args, sys.executable, *argv]
    env = dict(env, **{IN_MPI_VARIABLE: "1"})
    become_subreaper()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, start_new_session=True, pass_fds=fds)
    relay = StderrRelay(proc.stderr)
    return _supervise([proc], report_grace_s=2 * config.faults.peer_timeout_s + 10.0, relay=relay)


def _spawn_torch(nprocs: int, argv: list[str], env: dict, *, report_grace_s: float, fds: tuple[int, ...] = ()) -> Ended:
    env = dict(env)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nprocs))
    become_subreaper()
    procs = []
    for rank in range(nprocs):
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
        # every rank's stdout passes, as under mpiexec: the collector (the coordinator, often the last
        # rank) prints the run's lines, and a rank that prints nothing costs nothing
        procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, start_new_session=True, pass_fds=fds))
    return _supervise(procs, report_grace_s=report_grace_s)


#: The signal (SIGINT or SIGTERM, counted together) that forces an exit: the first one stops the job cleanly and
#: the second is only counted (a Ctrl-C and a supervisor's SIGTERM; an impatient second Ctrl-C).
FORCE_AFTER_SIGNALS = 3
#: Signals within this many seconds of the last counted one are one signal: one ``kill -INT`` to a process group
#: under GNU ``timeout`` reaches the launcher up to three times (directly, then from ``timeout`` to its child and
#: to its group) within microseconds.
SIGNAL_BURST_S = 1.0


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a reentrant write, the handler ran inside one
        pass


def _supervise(
    procs: list[subprocess.Popen], *, report_grace_s: float = 15.0, relay: StderrRelay | None = None
) -> Ended:
    """Wait for the job; forward the first SIGINT/SIGTERM (the third forces an exit); if one process fails, stop
    the rest.

    Whatever happens, no process of the job outlives this call: the launcher is a
    child subreaper and kills its whole process tree at the end (hydra moves
    every rank into a session of its own, out of reach of a process-group kill).

    When a rank dies, hydra (with ``-disable-auto-cleanup``) signals the others
    and exits at once; the surviving ranks, now re-parented to us, get
    ``report_grace_s`` to notice the loss and say which rank it was (less, once
    a failure is reported: see :func:`_wait_for_orphans`). ``relay`` reads
    mpiexec's stderr (see :mod:`gflowdist.cli.stderr_relay`).
    """
    interrupted: list[int] = []
    tracker = DescendantTracker(os.getpid())

    last = [-1e9]  # when the last counted signal came

    def forward(signum, _frame):
        now = time.monotonic()
        if now - last[0] < SIGNAL_BURST_S:  # the same signal again, by another route (a process group's)
            return
        last[0] = now
        interrupted.append(signum)
        if len(interrupted) == 1:  # once: a second signal makes hydra kill every rank at once (exit 255)
            for p in procs:
                if p.poll() is None:
                    kill_group(p.pid, signum)
        elif len(interrupted) < FORCE_AFTER_SIGNALS:
            _say(
                f"gflowdist: {signal.Signals(signum).name} again: still stopping cleanly (checkpoint, report, "
                f"ledger); signal {FORCE_AFTER_SIGNALS} times to force an exit"
            )
        elif len(interrupted) == FORCE_AFTER_SIGNALS:
            _say("gflowdist: forced exit: every process of the job is killed now; nothing more is saved")
            for p in procs:
                kill_group(p.pid)
            tracker.kill()

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        grace_until = None
        next_scan = 0.0
        while any(p.poll() is None for p in procs):
            if time.monotonic() >= next_scan:  # remember the ranks before their parents go
                tracker.scan()
                next_scan = time.monotonic() + 0.5
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if (failed or _failure_reported(relay)) and grace_until is None:
                # a rank failed: the launcher (hydra) gets the same grace to end the job as orphans do
                grace_until = time.monotonic() + report_grace_s
            if interrupted and grace_until is None:
                grace_until = time.monotonic() + 60.0
            if grace_until is not None and time.monotonic() > grace_until:
                break
            time.sleep(0.05)
        if not interrupted and any(p.returncode not in (None, 0) for p in procs):
            _wait_for_orphans(report_grace_s, tracker, relay)
    finally:
        for p in procs:
            if p.poll() is None:
                kill_group(p.pid)
            p.wait()
        _reap_leftovers(tracker)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    codes = [p.returncode for p in procs]
    failed = next((c for c in codes if c != 0), 0)
    forced = len(interrupted) >= FORCE_AFTER_SIGNALS  # killed on purpose: the status is the signal's, as a stop's
    if interrupted and (forced or failed in (0, -signal.SIGINT, -signal.SIGTERM)):
        failed = 130 if interrupted[0] == signal.SIGINT else 143
    elif failed < 0:
        failed = 128 - failed
    if relay is not None:
        relay.join(0.5)  # the last lines mpiexec wrote
    message = _report_failure(failed, relay)
    return Ended(failed, message, interrupted=bool(interrupted))
