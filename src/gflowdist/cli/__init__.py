"""The ``gflowdist`` command line: ``gflowdist <command> ...`` and ``python -m gflowdist``.

Subcommands register themselves: every module ``gflowdist/cli/<name>_cmd.py``
is found by name and must expose::

    def add_parser(subparsers: argparse._SubParsersAction) -> None:
        parser = subparsers.add_parser("<name>", help="one line")
        parser.add_argument(...)
        parser.set_defaults(handler=run)      # run(args: argparse.Namespace) -> int

Running a command imports its module only (``gflowdist --help`` and a mistyped
command import them all, to list them). Rules for command modules, so that
``gflowdist --help`` stays instant:
import nothing heavy at module level (no torch, no mpi4py, no numpy); import
inside the handler. The handler returns the exit status. A
:class:`~gflowdist.errors.ConfigError` or :class:`~gflowdist.errors.LayoutError`
escaping a handler is printed as one line on stderr with exit status 2 (no
traceback); any other :class:`~gflowdist.errors.GflowdistError` gives status 1.
A command-line mistake (an unknown option, a bad ``-n``) is one line too,
``gflowdist <command>: error: <what> (see gflowdist <command> --help)``,
status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from gflowdist.errors import ConfigError, GflowdistError, LayoutError
from gflowdist.jobenv import WARM_VARIABLE

__all__ = ["main", "build_parser", "command_names", "command_modules", "OneLineParser", "EXIT_USAGE", "EXIT_FAILURE"]

EXIT_FAILURE = 1
"""A command ran and failed."""
EXIT_USAGE = 2
"""The command line, the config or the layout is wrong (argparse uses 2 too)."""

_SUFFIX = "_cmd"


def command_names() -> list[str]:
    """Every command's name (``run`` for ``gflowdist.cli.run_cmd``), sorted; imports none of them."""
    return sorted(info.name[: -len(_SUFFIX)] for info in pkgutil.iter_modules(__path__) if info.name.endswith(_SUFFIX))


def command_modules() -> list[ModuleType]:
    """Every ``gflowdist.cli.<name>_cmd`` module, sorted by name."""
    return [_command_module(name) for name in command_names()]


def _command_module(name: str) -> ModuleType:
    return importlib.import_module(f"{__name__}.{name}{_SUFFIX}")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line on stderr (status 2), not usage + error."""

    # argparse's signature returns NoReturn
    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command module; with ``command``, that command's only (what
    running it needs: the other command modules are not imported)."""
    from gflowdist import __version__

    parser = OneLineParser(
        prog="gflowdist",
        description="Asynchronous actor / learner / replay-buffer training on MPI and torch.distributed.",
    )
    parser.add_argument("--version", action="version", version=f"gflowdist {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in command_modules() if command is None else [_command_module(command)]:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (``python -m gflowdist`` exits with it)."""
    if argv is None and WARM_VARIABLE in os.environ:  # a rank's keeper, before this process reads anything
        from gflowdist.cli.rank_keeper import hand_over_early

        hand_over_early(sys.argv[1:])
    given = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(given[0] if given and given[0] in command_names() else None)  # only the command's
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, --version and usage errors
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_USAGE)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    where = f"gflowdist {args.command}"
    try:
        return int(handler(args))
    except ConfigError as err:
        print(f"{where}: config error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except LayoutError as err:
        print(f"{where}: layout error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except GflowdistError as err:
        print(f"{where}: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `gflowdist report RUN --json | head`: the reader left
        sys.stderr.close()
        return 0
