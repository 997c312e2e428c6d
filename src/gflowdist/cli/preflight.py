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
   exists and answers ``--version``;
5. the role modules import and each class subclasses its role and implements
   what the role needs: in a child Python (:mod:`gflowdist.cli.role_check`),
   so the torch a role module imports, and anything else it does at import
   time, stays out of the launcher. With one rank, the process that will run
   the job imports them itself.

Steps 1-4 import neither torch nor the user's code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from gflowdist.errors import ConfigError, LayoutError
from gflowdist.jobenv import MPIEXEC_VARIABLE
from gflowdist.process_tree import kill_group

__all__ = ["check_layout_fits", "check_extras", "check_roles_named", "resolve_roles", "check_roles_import", "check_launcher", "LauncherFacts"]

_ROLES = ("trainer", "actor", "buffer", "coordinator")


def check_layout_fits(config, world_size: int, *, source: str, hosts=None):
    """The layout for ``world_size`` ranks (``source`` says where that number came from).

    Without ``hosts``, a ``node-local`` placement is checked only as far as the
    counts go (the ranks know their hosts and check the rest); returns None then.
    """
    from gflowdist.layout import describe_fit, plan_layout, resolve_counts

    where = config.file or "the config"
    try:
        if config.layout.placement == "node-local" and hosts is None:
            resolve_counts(world_size, config.layout)
            return None
        return plan_layout(world_size, config.layout, hosts)
    except LayoutError as err:
        fit = describe_fit(config.layout)
        fix = (f"start {fit}, or change" if fit.startswith("-n") else f"{fit}: change") + \
            f" the layout counts in {where}"
        raise LayoutError(f"{err} ({source}): {fix}") from None


def check_extras(config) -> None:
    """Step 1b: what the config asks for beyond the core is installed (found without importing it)."""
    import importlib.util

    if config.run.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("is true, but the tensorboard package is not installed: pip install "
                          "'gflowdist[tensorboard]' (or set run.tensorboard: false)", key="run.tensorboard",
                          file=config.file)


def check_roles_named(config, layout=None) -> None:
    """Step 2: every role the layout uses has a class (``layout`` None: judged from the counts)."""
    counts = _role_counts(config, layout)
    for role, attr in (("trainer", "trainers"), ("actor", "actors")):
        if counts.get(attr) and getattr(config.roles, role) is None:
            raise ConfigError(f"is not set, but the layout has {counts[attr]} {attr}: name your {role.capitalize()} "
                              f"subclass, e.g. roles.{role}: my_roles.py:My{role.capitalize()}",
                              key=f"roles.{role}", file=config.file)


def resolve_roles(config) -> dict[str, str]:
    """Step 3: every configured reference resolves statically; ``{role: what it resolves to}``.

    See :func:`gflowdist.config.check_class_ref`.
    """
    from gflowdist.config import check_class_ref

    return {role: check_class_ref(ref, key=f"roles.{role}", file=config.file)
            for role, ref in _configured(config).items()}


def _role_counts(config, layout) -> dict[str, int]:
    if layout is not None:
        return {"trainers": len(layout.trainers), "actors": len(layout.actors)}
    counts = config.layout.counts()  # node-local: unknown "rest" counts as used
    return {name: (1 if value == "rest" else value) for name, value in counts.items()}


def _configured(config) -> dict[str, str]:
    return {role: ref for role in _ROLES if (ref := getattr(config.roles, role)) is not None}


def check_roles_import(config, resolved: dict[str, str], *, in_child: bool = True) -> None:
    """Step 5: import every configured role class and check it (in a child Python by default).

    ``resolved`` is what :func:`resolve_roles` returned. A child's passing
    verdict is remembered until a file it loaded changes (:mod:`gflowdist.cli.role_cache`).
    """
    from gflowdist.cli import role_cache

    roles = _configured(config)
    key = role_cache.cache_key(resolved)
    if not roles or (in_child and role_cache.remembered(key)):
        return
    if not in_child:
        from gflowdist.cli.role_check import check_role_class

        for role, ref in roles.items():
            check_role_class(role, ref, config.file)
        return
    from gflowdist.cli.role_check import VERDICT_MARK

    command = [sys.executable, "-m", "gflowdist.cli.role_check", config.file or "",
               *(f"{role}={ref}" for role, ref in roles.items())]
    timeout = config.faults.startup_timeout_s
    out, err, code = _run_child(command, timeout)
    verdicts = [line[len(VERDICT_MARK):] for line in out.splitlines() if line.startswith(VERDICT_MARK)]
    if not verdicts:
        last = (err.strip().splitlines() or ["(nothing on stderr)"])[-1]
        described = "did not finish within faults.startup_timeout_s" if code is None else f"ended with status {code}"
        raise ConfigError(f"importing {', '.join(roles.values())} {described} before it could be checked; "
                          f"its last line: {last}", key="roles", file=config.file)
    verdict = json.loads(verdicts[-1])
    if "error" in verdict:
        raise ConfigError(verdict["error"])
    role_cache.remember(key, verdict.get("files", {}))


def _run_child(command: list[str], timeout: float) -> tuple[str, str, int | None]:
    """Run ``command`` in its own session; on timeout kill its whole group. ``code`` None = timed out."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return out, err, proc.returncode
    except subprocess.TimeoutExpired:
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
        done = subprocess.run([resolved, "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ConfigError(f"'{path} --version' failed ({err}): {fix}", key=key, file=file) from None
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        first = (text.splitlines() or [""])[0]
        raise ConfigError(f"'{path} --version' exited with status {done.returncode} ({first}): {fix}",
                          key=key, file=file)
    return LauncherFacts(resolved, text)
