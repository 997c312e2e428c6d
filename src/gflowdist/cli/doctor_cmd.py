"""``gflowdist doctor [CONFIG] [KEY.PATH=VALUE ...] [--json] [--config CONFIG] [--timeout S]``: can this machine
run gflowdist (and the job CONFIG describes)?

``CONFIG`` is positional as for ``gflowdist run`` and ``gflowdist layout``
(``--config CONFIG`` says the same). With a config, the doctor also checks
the extras it needs (:func:`gflowdist.cli.preflight.needed_extras`): the
tensorboard package for ``run.tensorboard``, gymnasium for role files that
use ``gflowdist.rl`` or a ``params.env_id``; each is a line ``extra <name>``,
essential, with the pip command that installs it.

Checks, in order, each printed as one line ``ok`` / ``MISSING`` / ``FAILED``
with, for every problem, the command or setting that fixes it:

============  =========  ==========================================================
check         essential  what is looked at
============  =========  ==========================================================
python        yes        ``sys.version`` (>= 3.10) and ``sys.executable``
gflowdist     yes        ``gflowdist.__version__``
torch, numpy, yes        imported; version >= the floor of pyproject.toml
mpi4py,
msgpack,
PyYAML,
matplotlib
MPI library   yes        first line of ``MPI.Get_library_version()``, asked in a
                         child Python (``mpi4py.rc.initialize = False``: no
                         ``MPI_Init``), so a broken library cannot crash the doctor
mpiexec       yes        which one ``gflowdist run`` would use and ``mpiexec --version``
launcher      no (info)  :func:`gflowdist.comm.select.describe_environment`
gloo          yes        ``torch.distributed.is_gloo_available()``
devices       no         the devices torch sees and the one ``launch.devices`` (of
                         ``--config``, with the overrides) gives this process
                         (:mod:`gflowdist.cli.doctor_devices`)
CUDA, nccl    no         ``torch.cuda.is_available()``, ``is_nccl_available()``
mpi ping      yes        ``mpiexec -n 2 python -c ...``: :func:`~gflowdist.cli.doctor_ping.ping_child`
                         on :class:`~gflowdist.comm.mpi.MPIComm`
gloo ping     yes        two Pythons with an ``env://`` rendezvous on a free
                         loopback port: :func:`~gflowdist.cli.doctor_ping.ping_child`
                         on :class:`~gflowdist.comm.torch_dist.TorchComm`
============  =========  ==========================================================

Which ``mpiexec``: the rule ``gflowdist run`` follows too,
:func:`gflowdist.jobenv.locate_mpiexec`: ``launch.mpiexec`` of ``--config``
when given and set, else the ``GFLOWDIST_MPIEXEC`` environment variable, else
the one next to ``sys.executable``, else ``mpiexec`` on ``PATH``.

A ping sends ``PING_BYTES`` bytes from rank 0 to rank 1, which sends them
back; one warm-up exchange, then ``PING_ROUNDS`` timed ones. The reported
round-trip time is their median (``sorted(rtts)[PING_ROUNDS // 2]``). A ping's
processes run in their own sessions, without the caller's launcher variables,
and are killed (the whole process group) after ``--timeout`` seconds.

Exit status 0 when every essential check is ``ok``, else 1. ``--json`` prints
``{"ok": bool, "checks": [{"name", "status", "essential", "detail", "fix"}]}``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from gflowdist.cli.arguments import add_override_arguments, split_late_options
from gflowdist.cli.doctor_check import FAILED, MISSING, OK, Check, child_env, last_line, run_processes
from gflowdist.cli.doctor_ping import gloo_ping_verdict, mpi_ping_verdict, start_gloo_ping, start_mpi_ping
from gflowdist.jobenv import MPIEXEC_VARIABLE, locate_mpiexec

__all__ = ["add_parser", "run", "run_checks", "render", "mpiexec_check", "mpiexec_version"]

#: Default seconds a ping may take before its processes are killed.
DEFAULT_TIMEOUT_S = 30.0
MIN_PYTHON = (3, 10)
#: (label, module, distribution, floor, essential); floors are pyproject.toml's.
PACKAGES = (
    ("torch", "torch", "torch", "2.1", True),
    ("numpy", "numpy", "numpy", "1.24", True),
    ("mpi4py", "mpi4py", "mpi4py", "3.1", True),
    ("msgpack", "msgpack", "msgpack", "1.0", True),
    ("PyYAML", "yaml", "PyYAML", "6.0", True),
    ("matplotlib", "matplotlib", "matplotlib", "3.6", True),
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gflowdist doctor``."""
    parser = subparsers.add_parser(
        "doctor",
        help="check Python, packages, MPI, mpiexec, gloo; ping 2 ranks on each engine",
        description="Check that this machine can run gflowdist: versions, the MPI library, "
        "which mpiexec would be used, and a real 2-rank ping on MPI and on gloo.",
    )
    add_override_arguments(parser)
    _add_options(parser)
    parser.set_defaults(handler=run)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", default=None, help="print the checks as JSON")
    parser.add_argument(
        "--config",
        metavar="CONFIG",
        default=None,
        help="a run config whose launch.mpiexec, launch.mpiexec_args and launch.devices "
        "to check (overrides apply to it, or to the defaults without it)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"seconds each ping may take before it is killed (default {DEFAULT_TIMEOUT_S:g})",
    )


def run(args: argparse.Namespace) -> int:
    """Run every check, print them; 0 when every essential check passed, else 1."""
    from gflowdist.cli import EXIT_FAILURE
    from gflowdist.config import Config

    positional = _take_positional_config(args)
    overrides = split_late_options(args, "gflowdist doctor", _add_options)
    if positional is not None:
        if args.config is not None:
            from gflowdist.errors import ConfigError

            raise ConfigError(f"two configs: {positional} and --config {args.config}: give one", key="CONFIG")
        args.config = positional
    config = (
        Config.from_yaml(args.config, overrides) if args.config is not None else Config().apply_overrides(overrides)
    )
    launch = config.launch
    timeout = DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout
    if timeout <= 0:
        from gflowdist.errors import ConfigError

        raise ConfigError(f"must be > 0 seconds, got {timeout:g}", key="--timeout")
    checks = run_checks(launch.mpiexec, tuple(launch.mpiexec_args), timeout=timeout, devices=launch.devices)
    if args.config is not None:
        checks += extras_checks(config)
    ok = all(c.passed for c in checks if c.essential)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [c.to_dict() for c in checks]}, indent=1))
    else:
        print(render(checks, ok))
    return 0 if ok else EXIT_FAILURE


def _take_positional_config(args: argparse.Namespace) -> str | None:
    """``gflowdist doctor CONFIG ...``: the first token, when it is no override and no option, is the config
    (taken out of the overrides)."""
    tokens = list(args.overrides)
    if tokens and "=" not in tokens[0] and not tokens[0].startswith("-"):
        args.overrides = tokens[1:]
        return tokens[0]
    return None


def extras_checks(config: Any) -> list[Check]:
    """One essential check per extra package ``config`` needs (``extra gymnasium``...)."""
    from gflowdist.cli.preflight import needed_extras

    return [
        Check(f"extra {extra.module}", OK, f"installed ({extra.why})")
        if extra.installed()
        else Check(f"extra {extra.module}", MISSING, f"not installed; {extra.why} ({extra.key})", extra.fix())
        for extra in needed_extras(config)
    ]


def render(checks: list[Check], ok: bool) -> str:
    """The text answer: one line per check, a ``fix:`` line under each problem, a verdict."""
    width = max((len(c.name) for c in checks), default=0)
    lines = ["gflowdist doctor"]
    for c in checks:
        optional = "" if c.essential or c.passed else " (optional)"
        lines.append(f"  {c.status:<7}  {c.name:<{width}}  {c.detail}{optional}")
        if c.fix:
            lines.append(f"  {'':<7}  {'':<{width}}  fix: {c.fix}")
    failed = [c.name for c in checks if c.essential and not c.passed]
    lines.append(
        "all essential checks passed"
        if ok
        else f"{len(failed)} essential check{'s' if len(failed) > 1 else ''} did not pass: {', '.join(failed)}"
    )
    return "\n".join(lines)


# --- the checks ---------------------------------------------------------------------


def run_checks(
    configured_mpiexec: str | None = None,
    mpiexec_args: tuple[str, ...] = (),
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    devices: str | tuple[str, ...] = "auto",
) -> list[Check]:
    """Every check, in the order of the module docstring.

    The two pings start first (when what they need is installed: a module
    spec is found without importing it) and run while this process imports
    and inspects the packages, so the doctor takes about as long as its
    slowest part, not the sum.
    """
    found_check, mpiexec = mpiexec_check(configured_mpiexec)
    installed = {name for name in ("torch", "numpy", "msgpack", "mpi4py") if importlib.util.find_spec(name) is not None}
    can_gloo = {"torch", "numpy", "msgpack"} <= installed
    mpi_ping = gloo_ping = None
    try:
        if mpiexec is not None and can_gloo and "mpi4py" in installed:
            mpi_ping = start_mpi_ping(mpiexec, mpiexec_args, timeout)
        if can_gloo:
            gloo_ping = start_gloo_ping(timeout)
        checks = [_python_check(), _gflowdist_check()]
        checks += [_package_check(*spec) for spec in PACKAGES]
        have = {c.name for c in checks if c.passed}
        checks.append(
            _mpi_library_check()
            if "mpi4py" in have
            else Check("MPI library", FAILED, "not asked: mpi4py is missing", fix="pip install 'mpi4py>=3.1'")
        )
        checks.append(found_check)
        checks += (
            _torch_checks(devices)
            if {"torch", "numpy", "msgpack"} <= have
            else [
                Check(
                    "launcher",
                    FAILED,
                    "not looked at: gflowdist.comm needs torch, numpy and msgpack (see above)",
                    essential=False,
                ),
                Check("gloo", FAILED, "not looked at: needs torch (see above)"),
            ]
        )
        checks.append(
            mpi_ping_verdict(mpi_ping.finish(), timeout)
            if mpi_ping is not None
            else Check("mpi ping", FAILED, "not run: needs mpiexec, mpi4py, torch, numpy and msgpack (see above)")
        )
        checks.append(
            gloo_ping_verdict(gloo_ping.finish(), timeout)
            if gloo_ping is not None
            else Check("gloo ping", FAILED, "not run: needs torch, numpy and msgpack (see above)")
        )
    finally:
        for job in (mpi_ping, gloo_ping):
            if job is not None:
                job.kill()
    return checks


def _version_tuple(text: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def _python_check() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("python", FAILED, f"{version} is older than 3.10 ({sys.executable})", fix="use Python >= 3.10")
    return Check("python", OK, f"{version} ({sys.executable})")


def _gflowdist_check() -> Check:
    from gflowdist import __version__

    return Check("gflowdist", OK, f"{__version__} ({Path(__file__).resolve().parents[1]})")


def _installed_version(module: Any, distribution: str) -> str:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


def _package_check(label: str, module_name: str, distribution: str, floor: str, essential: bool) -> Check:
    fix = f"pip install '{distribution}>={floor}'"
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        return Check(label, MISSING, f"cannot import {module_name}: {err}", fix=fix, essential=essential)
    version = _installed_version(module, distribution)
    if _version_tuple(version) < _version_tuple(floor):
        return Check(label, FAILED, f"{version} is older than {floor}", fix=fix, essential=essential)
    return Check(label, OK, version, essential=essential)


_LIBRARY_PROGRAM = (
    "import mpi4py\n"
    "mpi4py.rc.initialize = False\n"
    "mpi4py.rc.finalize = False\n"
    "from mpi4py import MPI\n"
    "print(MPI.Get_library_version().strip().splitlines()[0])\n"
)


def _mpi_library_check() -> Check:
    fix = (
        "pip install mpich (mpi4py needs an MPI library at run time; or point it at your "
        "site's MPI and reinstall mpi4py)"
    )
    results = run_processes([([sys.executable, "-c", _LIBRARY_PROGRAM], child_env())], 20.0)
    code, output, timed_out = results[0]
    if timed_out:
        return Check("MPI library", FAILED, "loading mpi4py.MPI did not finish in 20 s", fix=fix)
    if code != 0:
        return Check("MPI library", FAILED, f"loading mpi4py.MPI failed: {last_line(output)}", fix=fix)
    return Check("MPI library", OK, " ".join(last_line(output).split()))


def mpiexec_check(configured: str | None) -> tuple[Check, str | None]:
    path, source = locate_mpiexec(configured)
    if path is None:
        return Check(
            "mpiexec",
            MISSING,
            "no mpiexec next to this Python or on PATH",
            fix=f"pip install mpich (or set {MPIEXEC_VARIABLE} / launch.mpiexec to your site's mpiexec)",
        ), None
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        what = "does not exist" if not os.path.exists(path) else "is not an executable file"
        undo = f"unset {MPIEXEC_VARIABLE}" if source == MPIEXEC_VARIABLE else "fix launch.mpiexec"
        return Check(
            "mpiexec",
            MISSING,
            f"{path} ({source}) {what}",
            fix=f"{undo}, or point it at an existing mpiexec; `pip install mpich` puts one next to this Python",
        ), None
    code, output, timed_out = run_processes([([path, "--version"], child_env())], 10.0)[0]
    if timed_out or code != 0:
        why = "timed out after 10 s" if timed_out else f"exited {code}: {last_line(output)}"
        return Check(
            "mpiexec",
            FAILED,
            f"{path} ({source}): `mpiexec --version` {why}",
            fix="pip install mpich, or set GFLOWDIST_MPIEXEC to a working mpiexec",
        ), None
    return Check("mpiexec", OK, f"{path} ({source}): {mpiexec_version(output)}"), path


def mpiexec_version(output: str) -> str:
    """``"HYDRA 5.0.2"`` from MPICH's ``Version:`` line, else the first non-empty line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("Version:"):
            family = "HYDRA" if any("HYDRA" in item for item in lines) else "version"
            return f"{family} {line.split(':', 1)[1].strip()}"
    return lines[0] if lines else "(printed no version)"


def _torch_checks(devices: str | tuple[str, ...] = "auto") -> list[Check]:
    import torch
    import torch.distributed as dist

    from gflowdist.comm.select import describe_environment, in_mpi_job, in_torch_job

    inside = " -- doctor runs inside a job; its pings do not inherit these" if in_mpi_job() or in_torch_job() else ""
    checks = [Check("launcher", OK, describe_environment() + inside, essential=False)]
    if not dist.is_available() or not dist.is_gloo_available():
        checks.append(
            Check(
                "gloo",
                FAILED,
                f"torch {torch.__version__} has no gloo backend",
                fix="install a torch build with distributed support (the PyPI wheels for Linux and macOS have gloo)",
            )
        )
    else:
        checks.append(Check("gloo", OK, "torch.distributed gloo backend available"))
    from gflowdist.cli.doctor_devices import describe_devices

    ok, detail, fix = describe_devices(devices)
    checks.append(Check("devices", OK if ok else FAILED, detail, fix=fix, essential=False))
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        checks.append(
            Check("CUDA", OK, f"{count} device{'s' if count != 1 else ''}, CUDA {torch.version.cuda}", essential=False)
        )
        nccl = dist.is_available() and dist.is_nccl_available()
        checks.append(
            Check(
                "nccl",
                OK if nccl else MISSING,
                "available" if nccl else "this torch build has no nccl",
                fix=None if nccl else "install a CUDA build of torch with nccl",
                essential=False,
            )
        )
    else:
        checks.append(
            Check(
                "CUDA",
                MISSING,
                "no CUDA device (CPU only: the torch engine uses gloo)",
                fix="needed only for GPU training: a CUDA build of torch and a GPU",
                essential=False,
            )
        )
        checks.append(Check("nccl", MISSING, "not usable without CUDA", essential=False))
    return checks
