"""What ``gflowdist run`` and ``gflowdist layout`` check before anything starts.

Each mistake is one :class:`~gflowdist.errors.ConfigError` or
:class:`~gflowdist.errors.LayoutError` (one line, exit status 2, no run
directory), found in this order, cheapest first:

1. the layout fits the number of ranks (the message says which ``-n`` fits),
   and what the config asks for is installed (``run.tensorboard``: tensorboard);
2. every role the layout uses has a class (``roles.trainer`` when there are
   trainers, ``roles.actor`` when there are actors);
3. every configured class reference resolves without running any user code:
   the file exists, parses and defines the class (did-you-mean), or a
   package's top-level module exists (:func:`gflowdist.config.check_class_ref`);
4. ``gflowdist run`` only, when it starts ``mpiexec`` itself: the launcher
   exists and answers ``--version`` within :data:`LAUNCHER_PROBE_TIMEOUT_S`;
   under ``faults.on_actor_loss: replace`` it must be one known to serve
   ``MPI_Comm_spawn`` (:func:`check_launcher_spawns`);
5. the role modules import and each class subclasses its role and implements
   what the role needs: in a child Python (:mod:`gflowdist.cli.role_check`),
   so the torch a role module imports, and anything else it does at import
   time, stays out of the launcher. With one rank, the process that will run
   the job imports them itself;
6. ``gflowdist run`` only: a ``launch.devices`` that asks for CUDA (``cuda``,
   or a list naming one) gets it on every rank the launch starts on this
   host. The child of step 5 counts the CUDA devices torch sees (run even when
   its role verdict is remembered: a GPU count is no file);
   :func:`gflowdist.devices.choose_device` decides for each local rank. Where
   the ranks may run elsewhere (a hostfile or host list in
   ``launch.mpiexec_args``, a batch allocation that mpiexec spreads them over)
   the ranks decide for themselves.

Steps 1-4 import neither torch nor the user's code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Literal, overload

from gflowdist.engines import launched_engine
from gflowdist.errors import ConfigError, LayoutError
from gflowdist.jobenv import MPIEXEC_VARIABLE
from gflowdist.process_tree import DescendantTracker, kill_group

__all__ = [
    "check_layout_fits",
    "check_extras",
    "needed_extras",
    "Extra",
    "check_roles_named",
    "resolve_roles",
    "check_roles_import",
    "check_launcher",
    "check_launcher_spawns",
    "LauncherFacts",
    "devices_judged_here",
    "check_devices",
    "LAUNCHER_PROBE_TIMEOUT_S",
    "ALLOCATION_VARIABLES",
]

_ROLES = ("trainer", "actor", "buffer", "coordinator")

#: How long the launcher gets to answer ``--version`` (a real mpiexec answers in milliseconds).
LAUNCHER_PROBE_TIMEOUT_S = 10.0

#: mpiexec / mpirun options (before any ``=``) that place ranks on other hosts than this one.
_HOST_OPTIONS = frozenset(
    {
        "-f",
        "-hostfile",
        "--hostfile",
        "--default-hostfile",
        "-machinefile",
        "--machinefile",
        "-hosts",
        "--hosts",
        "-host",
        "--host",
        "-H",
        "-hostlist",
    }
)

#: Batch allocations an mpiexec started inside spreads its ranks over (Slurm, PBS, LSF, SGE, Cobalt,
#: hydra's own host file variable).
ALLOCATION_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "PBS_JOBID",
    "LSB_JOBID",
    "PE_HOSTFILE",
    "COBALT_NODEFILE",
    "HYDRA_HOST_FILE",
)


def check_layout_fits(config, world_size: int, *, source: str, hosts=None):
    """The layout for ``world_size`` ranks (``source`` says where that number came from).

    Without ``hosts``, a ``node-local`` placement is checked only as far as the
    counts go (the ranks know their hosts and check the rest); returns None then.
    """
    from gflowdist.config import REST
    from gflowdist.layout import describe_fit, fitting_world_sizes, plan_layout, resolve_counts

    where = config.file or "the config"
    try:
        if config.layout.placement == "node-local" and hosts is None:
            resolve_counts(world_size, config.layout)
            return None
        return plan_layout(world_size, config.layout, hosts)
    except LayoutError as err:
        fit = describe_fit(config.layout)
        sizes = fitting_world_sizes(config.layout)
        if not fit.startswith("-n"):
            fix = f"{fit}: change the layout counts in {where}"
        elif REST not in config.layout.counts().values() and max(sizes) < world_size:
            fix = f"start {fit}, or give one count as 'rest' in {where}"  # more ranks than fixed counts
        else:
            fix = f"start {fit}, or change the layout counts in {where}"
        raise LayoutError(f"{err.fact} ({source}): {fix}") from None  # our words for the fix, not the library's


@dataclass(frozen=True)
class Extra:
    """A package beyond the core that a config needs: ``module`` (found without importing it), the
    setting or file that needs it (``key``), why, and the pip extra that installs it."""

    module: str
    key: str
    why: str
    extra: str

    def installed(self) -> bool:
        import importlib.util

        return importlib.util.find_spec(self.module) is not None

    def fix(self) -> str:
        return f"pip install 'gflowdist[{self.extra}]'"


#: What in a role file means gymnasium's environments (gflowdist.rl's actors step them).
_RL_WORDS = ("gflowdist.rl", "import gymnasium", "from gymnasium")


def needed_extras(config) -> list[Extra]:
    """The extras ``config`` needs: tensorboard for ``run.tensorboard``; gymnasium for a role file that uses
    ``gflowdist.rl`` or gymnasium (read as text, not imported), or a ``params.env_id``."""
    from pathlib import Path

    from gflowdist.config import absolute_ref

    extras = []
    if config.run.tensorboard:
        extras.append(Extra("tensorboard", "run.tensorboard", "run.tensorboard is true", "tensorboard"))
    for role, ref in _configured(config).items():
        try:
            path = Path(absolute_ref(ref, key=f"roles.{role}", file=config.file).rpartition(":")[0])
            text = path.read_text(errors="replace") if path.suffix == ".py" and path.is_file() else ""
        except (ConfigError, OSError):
            continue
        if any(word in text for word in _RL_WORDS):
            extras.append(Extra("gymnasium", f"roles.{role}", f"{path.name} uses gymnasium environments", "rl"))
            break
    else:
        if "env_id" in config.params:
            extras.append(Extra("gymnasium", "params.env_id", "params.env_id names a gymnasium environment", "rl"))
    return extras


def check_extras(config) -> None:
    """Step 1b: what the config asks for beyond the core is installed (found without importing it).

    Also GFLOWDIST_REPORT_FIGURE, where ``report.figure`` leaves it to the variable: 0 or 1.
    """
    from gflowdist.config.figure_choice import figure_wanted

    figure_wanted(config.report.figure)
    for extra in needed_extras(config):
        if not extra.installed():
            also = " (or set run.tensorboard: false)" if extra.module == "tensorboard" else ""
            raise ConfigError(
                f"needs the {extra.module} package ({extra.why}), which is not installed: {extra.fix()}{also}",
                key=extra.key,
                file=config.file,
            )


def check_roles_named(config, layout=None) -> None:
    """Step 2: every role the layout uses has a class (``layout`` None: judged from the counts)."""
    counts = _role_counts(config, layout)
    for role, attr in (("trainer", "trainers"), ("actor", "actors")):
        if counts.get(attr) and getattr(config.roles, role) is None:
            raise ConfigError(
                f"is not set, but the layout has {counts[attr]} {attr}: name your {role.capitalize()} "
                f"subclass, e.g. roles.{role}: my_roles.py:My{role.capitalize()}",
                key=f"roles.{role}",
                file=config.file,
            )


def resolve_roles(config) -> dict[str, str]:
    """Step 3: every configured reference resolves statically; ``{role: what it resolves to}``.

    See :func:`gflowdist.config.check_class_ref`.
    """
    from gflowdist.config import check_class_ref

    return {
        role: check_class_ref(ref, key=f"roles.{role}", file=config.file) for role, ref in _configured(config).items()
    }


def _role_counts(config, layout) -> dict[str, int]:
    if layout is not None:
        return {"trainers": len(layout.trainers), "actors": len(layout.actors)}
    counts = config.layout.counts()  # node-local: unknown "rest" counts as used
    return {name: (1 if value == "rest" else value) for name, value in counts.items()}


def _configured(config) -> dict[str, str]:
    return {role: ref for role in _ROLES if (ref := getattr(config.roles, role)) is not None}


@overload
def check_roles_import(
    config: Any, resolved: dict[str, str], *, in_child: bool = True, count_cuda: Literal[True]
) -> int: ...


@overload
def check_roles_import(
    config: Any, resolved: dict[str, str], *, in_child: bool = True, count_cuda: Literal[False] = False
) -> None: ...


def check_roles_import(
    config: Any, resolved: dict[str, str], *, in_child: bool = True, count_cuda: bool = False
) -> int | None:
    """Step 5: import every configured role class and check it (in a child Python by default).

    ``resolved`` is what :func:`resolve_roles` returned. A child's passing
    verdict is remembered until a file it loaded changes (:mod:`gflowdist.cli.role_cache`).
    With ``count_cuda``, returns how many CUDA devices torch sees there (the
    child runs then even with a remembered verdict); else None.
    """
    from gflowdist.cli import role_cache

    roles = _configured(config)
    key = role_cache.cache_key(resolved)
    if not count_cuda and (not roles or (in_child and role_cache.remembered(key))):
        return None
    if not in_child:
        from gflowdist.cli.role_check import check_role_class, cuda_device_count

        for role, ref in roles.items():
            check_role_class(role, ref, config.file)
        return cuda_device_count() if count_cuda else None
    from gflowdist.cli.role_check import COUNT_CUDA, VERDICT_MARK

    command = [
        sys.executable,
        "-m",
        "gflowdist.cli.role_check",
        config.file or "",
        *([COUNT_CUDA] if count_cuda else []),
        *(f"{role}={ref}" for role, ref in roles.items()),
    ]
    timeout = config.faults.startup_timeout_s
    out, err, code = _run_child(command, timeout)
    verdicts = [line[len(VERDICT_MARK) :] for line in out.splitlines() if line.startswith(VERDICT_MARK)]
    if not verdicts:
        last = (err.strip().splitlines() or ["(nothing on stderr)"])[-1]
        described = "did not finish within faults.startup_timeout_s" if code is None else f"ended with status {code}"
        raise ConfigError(
            f"importing {', '.join(roles.values())} {described} before it could be checked; its last line: {last}",
            key="roles",
            file=config.file,
        )
    verdict = json.loads(verdicts[-1])
    if "error" in verdict:
        raise ConfigError(verdict["error"])
    if roles:
        role_cache.remember(key, verdict.get("files", {}))
    return int(verdict.get("cuda_devices", 0)) if count_cuda else None


def devices_judged_here(config, nprocs: int, env=None) -> bool:
    """Whether ``gflowdist run`` checks ``launch.devices`` before starting ``nprocs`` ranks (step 6).

    Only a setting that can fail (:func:`gflowdist.devices.needs_cuda`), and
    only when every rank will run on this host and inherit its
    ``CUDA_VISIBLE_DEVICES``: the torch engine's workers and one rank always
    do; mpiexec's, unless ``launch.mpiexec_args`` name hosts or set
    ``CUDA_VISIBLE_DEVICES``, or a batch allocation is visible.
    """
    from gflowdist.devices import needs_cuda

    if not needs_cuda(config.launch.devices):
        return False
    if not launched_engine(config.launch.engine).uses_mpiexec or nprocs == 1:  # every rank starts on this host
        return True
    env = os.environ if env is None else env
    args = list(config.launch.mpiexec_args)
    if any(arg.split("=", 1)[0] in _HOST_OPTIONS or "CUDA_VISIBLE_DEVICES" in arg for arg in args):
        return False
    return not any(env.get(name) for name in ALLOCATION_VARIABLES)


def check_devices(config, nprocs: int, gpus: int) -> None:
    """Step 6: every one of the ``nprocs`` ranks started on this host, which sees ``gpus`` CUDA
    devices, gets the device ``launch.devices`` asks for (local rank i = rank i)."""
    from gflowdist.devices import choose_device

    for local in range(nprocs):
        try:
            choose_device(
                config.launch.devices, local, gpus, seen_by="this host", where=f"{nprocs} ranks, all on this host"
            )
        except ConfigError as err:
            if gpus:
                fix = f"list only cuda:0 to cuda:{gpus - 1} (or cuda, or auto)"
            else:
                fix = "set launch.devices to auto or cpu, or run where torch sees a GPU"
            mask = os.environ.get("CUDA_VISIBLE_DEVICES")
            if mask is not None:
                fix += f" (CUDA_VISIBLE_DEVICES={mask!r} is set)"
            raise ConfigError(f"{err.detail}: {fix}", key="launch.devices", file=config.file) from None


def _run_child(command: list[str], timeout: float) -> tuple[str, str, int | None]:
    """Run ``command`` in its own session; on timeout kill its whole group (and any descendant that left
    it), so nothing it started outlives the call. ``code`` None = timed out; OSError if it cannot start."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
        DescendantTracker(proc.pid).kill()  # those in sessions of their own, while they are still its
        kill_group(proc.pid)
        out, err = proc.communicate()
        return out, err, None


class LauncherFacts:
    """The mpiexec ``gflowdist run`` will start, and what its ``--version`` said."""

    def __init__(self, path: str, version: str):
        self.path = path
        self.version = version

    @property
    def is_hydra(self) -> bool:
        """MPICH's hydra (it takes ``-disable-auto-cleanup``)."""
        return "HYDRA" in self.version.upper()

    @property
    def spawns(self) -> bool:
        """Known to start processes for ``MPI_Comm_spawn``: MPICH's hydra, Open MPI's mpirun (PRRTE, ORTE)."""
        return self.is_hydra or any(name in self.version for name in ("Open MPI", "OpenRTE", "PRRTE", "prterun"))


def check_launcher_spawns(config, launcher: LauncherFacts) -> None:
    """Step 4b: ``faults.on_actor_loss: replace`` needs an mpiexec that serves ``MPI_Comm_spawn``."""
    if config.faults.on_actor_loss != "replace" or launcher.spawns:
        return
    first = (launcher.version.splitlines() or [""])[0].strip()
    raise ConfigError(
        f"is replace, but the mpiexec {launcher.path} ({first!r}) is not one known to serve MPI_Comm_spawn "
        "(MPICH's hydra and Open MPI's mpirun are): a replacement could not be started; use the mpiexec "
        "next to this Python (`pip install mpich`), or on_actor_loss: continue",
        key="faults.on_actor_loss",
        file=config.file,
    )


def check_launcher(config, find_mpiexec) -> LauncherFacts:
    """Step 4: the mpiexec exists, is executable and answers ``--version``."""
    path = find_mpiexec(config.launch.mpiexec)
    if config.launch.mpiexec:
        key, file = "launch.mpiexec", config.file
        fix = "set launch.mpiexec to your site's mpiexec, or remove it to use the one next to this Python"
    elif os.environ.get(MPIEXEC_VARIABLE):
        key, file = MPIEXEC_VARIABLE, None
        fix = f"unset {MPIEXEC_VARIABLE} or point it at an mpiexec (`pip install mpich` puts one next to this Python)"
    else:
        key, file = "launch.mpiexec", config.file
        fix = "`pip install mpich`, or set launch.mpiexec to your site's mpiexec"
    resolved = shutil.which(path)
    if resolved is None:
        problem = "is not executable" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"'{path}' {problem}: {fix}", key=key, file=file)
    try:
        out, err, code = _run_child([resolved, "--version"], LAUNCHER_PROBE_TIMEOUT_S)
    except OSError as error:
        raise ConfigError(f"'{path} --version' failed ({error}): {fix}", key=key, file=file) from None
    if code is None:
        raise ConfigError(
            f"'{path} --version' did not answer within {LAUNCHER_PROBE_TIMEOUT_S:g} s and was stopped: {fix}",
            key=key,
            file=file,
        )
    text = (out + err).strip()
    if code != 0:
        first = (text.splitlines() or [""])[0]
        raise ConfigError(f"'{path} --version' exited with status {code} ({first}): {fix}", key=key, file=file)
    return LauncherFacts(resolved, text)
