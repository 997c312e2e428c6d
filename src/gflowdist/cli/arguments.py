"""Arguments shared by the commands: a config, its overrides, a rank count.

One override syntax for every command that reads a config:

    gflowdist run CONFIG run.steps=200 layout.buffers=2 -n 4
    gflowdist layout CONFIG layout.buffers=2 -n 6
    gflowdist run CONFIG --set run.steps=200       # --set KEY.PATH=VALUE: the same, repeatable

An override is ``key.path=value``; the value is read as YAML (``2``, ``false``,
``null``, ``[a, b]``). Options may come before, between or after the
overrides, which apply in the order written. A token that is almost an
override is refused with the form to write instead::

    run.steps 5      ->  write run.steps=5 (key.path=value, no spaces)
    run.steps: 5     ->  write run.steps=5
    run.steps:5      ->  write run.steps=5
    --run.steps=5    ->  overrides take no dashes: write run.steps=5
    --steps 5        ->  not an option: write the override run.steps=5 (a key of exactly one section)

Everything here is argument handling; :meth:`gflowdist.config.Config.apply_overrides`
checks the keys and values.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from gflowdist.errors import ConfigError

__all__ = [
    "HelpFormatter",
    "add_config_arguments",
    "add_override_arguments",
    "split_late_options",
    "rank_count",
    "restart_count",
    "add_rank_count",
    "OVERRIDES_HELP",
]

OVERRIDES_HELP = (
    "config overrides KEY.PATH=VALUE, e.g. run.steps=200 layout.buffers=2 "
    "(the value is YAML; options may come in between)"
)

_SECTIONS = ("run", "launch", "layout", "roles", "replay", "sync", "faults", "report", "inference", "params")


class HelpFormatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description; keeps indented lines (examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") for line in lines[1:]):  # a heading and indented examples
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(
                    textwrap.fill(
                        " ".join(line.strip() for line in lines), width, initial_indent=indent, subsequent_indent=indent
                    )
                )
        return "\n\n".join(out)


def _count(text: str, *, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of {what} >= {low}, found {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a number of {what} >= {low}, found {value}")
    return value


def rank_count(text: str) -> int:
    """argparse type of ``-n``: an integer >= 1 (``-n 0`` is a mistake, not "use the default")."""
    return _count(text, low=1, what="ranks")


def _torchrun_option(option: str) -> Callable[[str], int]:
    def refuse(text: str) -> int:
        raise argparse.ArgumentTypeError(
            f"torchrun's option; gflowdist starts the ranks itself: write -n {text} "
            f"(or let torchrun start them: torchrun --standalone --nproc-per-node {text} -m gflowdist run CONFIG)"
        )

    return refuse


def add_rank_count(parser: argparse.ArgumentParser, help: str) -> None:
    """``-n N`` (also ``-np N`` and ``--nprocs N``, as mpiexec users type it); torchrun's
    ``--nproc-per-node``/``--nproc_per_node`` are answered with the form to write."""
    parser.add_argument("-n", "-np", "--nprocs", dest="nprocs", type=rank_count, default=None, metavar="N", help=help)
    for option in ("--nproc-per-node", "--nproc_per_node"):
        parser.add_argument(option, dest="torchrun_nprocs", type=_torchrun_option(option), help=argparse.SUPPRESS)


def restart_count(text: str) -> int:
    """argparse type of ``--max-restarts``: an integer >= 0."""
    return _count(text, low=0, what="restarts")


def add_config_arguments(parser: argparse.ArgumentParser, *, config_help: str, optional: bool = False) -> None:
    """``CONFIG``, the positional overrides and ``--set`` (its synonym)."""
    parser.add_argument("config", metavar="CONFIG", nargs="?" if optional else None, help=config_help)
    add_override_arguments(parser)


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional overrides (every token from the first one on) and ``--set``."""
    parser.add_argument("overrides", metavar="KEY.PATH=VALUE", nargs=argparse.REMAINDER, help=OVERRIDES_HELP)
    _add_set(parser)
    parser.set_defaults(command_parser=parser)  # `gflowdist run CONFIG --help` prints this parser's help


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="set_overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="the same as a positional override (repeatable)",
    )


def split_late_options(
    args: argparse.Namespace, prog: str, add_options: Callable[[argparse.ArgumentParser], None]
) -> list[str]:
    """Parse the options written among the overrides; returns every override, in order.

    ``args.overrides`` holds what followed ``CONFIG`` (argparse's remainder);
    options found there (``add_options`` declares them) are set on ``args`` as
    if written before it. Raises :class:`ConfigError` with the form to write
    for a token that is almost an override.
    """
    from gflowdist.cli import OneLineParser

    tokens = _unwrap_set(list(args.overrides))
    if ("-h" in tokens or "--help" in tokens) and getattr(args, "command_parser", None) is not None:
        args.command_parser.print_help()
        raise SystemExit(0)
    late = OneLineParser(prog=prog, add_help=False)
    add_options(late)
    found, rest = late.parse_known_args(tokens)
    for name, value in vars(found).items():
        if value is not None and value is not False:
            setattr(args, name, value)
    for index, token in enumerate(rest):
        if token.startswith("-"):
            _refuse_dashed(token, rest[index + 1] if index + 1 < len(rest) else None, late)
    _check_forms(rest)
    return list(getattr(args, "set_overrides", [])) + rest


def _unwrap_set(tokens: list[str]) -> list[str]:
    """``--set X`` and ``--set=X`` become ``X`` in place (a synonym keeps its order)."""
    out = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token == "--set":
            if index + 1 >= len(tokens):
                raise ConfigError("--set needs a value: --set key.path=value")
            out.append(tokens[index + 1])
            index += 2
            continue
        out.append(token[len("--set=") :] if token.startswith("--set=") else token)
        index += 1
    return out


def _refuse_dashed(token: str, following: str | None, parser: argparse.ArgumentParser) -> None:
    name, equals, value = token.lstrip("-").partition("=")
    if not equals and following is not None and "=" not in following and not following.startswith("-"):
        value = following
    if "." in name and name.split(".", 1)[0] in _SECTIONS:
        shown = f"{name}={value or 'VALUE'}"
        raise ConfigError(f"'{token}' is not an option: overrides take no dashes, write {shown}")
    home = _section_of(name)
    if home is not None:
        raise ConfigError(f"'{token}' is not an option of {parser.prog}: write the override {home}={value or 'VALUE'}")
    parser.error(f"unrecognized arguments: {token}")


def _section_of(name: str) -> str | None:
    """``"section.key"`` when ``name`` (``log-every`` = ``log_every``) is a key of exactly one section."""
    from gflowdist.config.loading import known_keys
    from gflowdist.config.sections import SECTIONS

    key = name.replace("-", "_")
    homes = [section for section, cls in SECTIONS.items() if key in known_keys(cls)]
    return f"{homes[0]}.{key}" if len(homes) == 1 else None


def _override_for(token: str) -> str | None:
    from gflowdist.config.loading import override_for

    return override_for(token)


def _check_forms(tokens: list[str]) -> None:
    for index, token in enumerate(tokens):
        following = tokens[index + 1] if index + 1 < len(tokens) else None
        value = following if following is not None and "=" not in following else "VALUE"
        if token.endswith("=") and following is not None and "=" not in following:
            raise ConfigError(
                f"'{token} {following}' is not an override: write {token}{following} (key.path=value, no spaces)"
            )
        if "=" in token:
            continue
        if token.endswith(":"):
            raise ConfigError(f"'{token} {value}' is YAML, not an override: write {token[:-1]}={value}")
        meant = _override_for(token)
        if meant is not None:
            raise ConfigError(f"'{token}' is YAML, not an override: write {meant} (key.path=value)")
        if value != "VALUE":  # a lone token: Config.apply_overrides says the same, without a value
            raise ConfigError(f"'{token}' is not an override: write {token}={value} (key.path=value, no spaces)")
