"""``gflowdist layout CONFIG [KEY.PATH=VALUE ...] [-n N] [--hosts ...] [--json]``: print the rank layout.

A dry run of ``gflowdist run``'s checks: reads the config (with overrides,
positional or ``--set``), plans the layout for ``N`` ranks (default
``launch.nprocs``), checks the role classes as ``gflowdist run`` would
(:mod:`gflowdist.cli.preflight`; a role the layout needs but the config does
not name is a ``note:`` line, not an error) and prints the table of
:meth:`gflowdist.layout.Layout.describe`, or the config / layout error with
exit status 2. It starts no rank.
"""

from __future__ import annotations

import argparse
import json

from gflowdist.cli.arguments import HelpFormatter, add_config_arguments, add_rank_count, split_late_options

__all__ = ["add_parser", "run"]

_EXAMPLES = """\
examples:
  gflowdist layout config.yaml -n 8
  gflowdist layout config.yaml -n 6 layout.buffers=2 --hosts a:3,b:3
  gflowdist layout config.yaml --set layout.buffers=2 --json"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gflowdist layout``."""
    parser = subparsers.add_parser(
        "layout",
        help="print the rank layout a config gives and check its roles (dry run, starts no rank)",
        description="Print which rank trains, acts, buffers or coordinates for a config and a number "
        "of ranks, after the checks gflowdist run makes before launching (the layout fits, "
        "the role classes resolve and import). Starts no rank.",
        epilog=_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    add_config_arguments(parser, config_help="YAML config file")
    _add_options(parser)
    parser.set_defaults(handler=run)


def _add_options(parser: argparse.ArgumentParser) -> None:
    add_rank_count(parser, "number of ranks (default: launch.nprocs of the config); -np N works too")
    parser.add_argument(
        "--hosts",
        default=None,
        metavar="HOSTS",
        help="host name of every rank: 'a,b,a,b', or run-length 'a:2,b:2' (needed by placement node-local)",
    )
    parser.add_argument("--json", action="store_true", default=None, help="print the layout as JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Plan, check and print the layout; errors propagate to :func:`gflowdist.cli.main`."""
    from gflowdist.cli import preflight
    from gflowdist.config import Config
    from gflowdist.errors import ConfigError, LayoutError
    from gflowdist.layout import parse_host_list

    overrides = split_late_options(args, "gflowdist layout", _add_options)
    config = Config.from_yaml(args.config, overrides)
    world_size = config.launch.nprocs if args.nprocs is None else args.nprocs
    hosts = parse_host_list(args.hosts) if args.hosts is not None else None
    if hosts is None and config.layout.placement == "node-local":
        raise LayoutError(
            "placement 'node-local' needs the host name of every rank: pass --hosts a,b,... or --hosts a:4,b:4"
        )
    source = f"-n {world_size}" if args.nprocs is not None else f"launch.nprocs = {world_size}"
    layout = preflight.check_layout_fits(config, world_size, source=source, hosts=hosts)
    notes = []
    try:
        preflight.check_roles_named(config, layout)
    except ConfigError as err:  # a layout may be planned before its classes are written
        notes.append(f"note: {err} (gflowdist run refuses this config)")
    judge_devices = hosts is None and preflight.devices_judged_here(config, world_size)
    if judge_devices:
        gpus = preflight.check_roles_import(config, preflight.resolve_roles(config), count_cuda=True)
        preflight.check_devices(config, world_size, gpus)
    else:
        preflight.check_roles_import(config, preflight.resolve_roles(config))
    if args.json:
        print(json.dumps(layout.to_dict(), indent=2))
    else:
        print("\n".join([layout.describe(), *notes]))
    return 0
