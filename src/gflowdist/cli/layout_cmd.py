"""``gflowdist layout CONFIG [-n N] [--hosts ...]``: print the rank layout; start nothing.

A dry run of the layout arithmetic: reads the config (with ``--set``
overrides), plans the layout for ``N`` ranks (default ``launch.nprocs``) and
prints the table of :meth:`gflowdist.layout.Layout.describe`, or the config /
layout error with exit status 2.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # noqa: SLF001 - argparse API
    """Register ``gflowdist layout``."""
    parser = subparsers.add_parser(
        "layout",
        help="print the rank layout a config gives (dry run, starts no process)",
        description="Print which rank trains, acts, buffers or coordinates for a config and a "
                    "number of ranks, without starting any process.")
    parser.add_argument("config", metavar="CONFIG", help="YAML config file")
    parser.add_argument("-n", "--nprocs", type=int, default=None, metavar="N",
                        help="number of ranks (default: launch.nprocs of the config)")
    parser.add_argument("--hosts", default=None, metavar="HOSTS",
                        help="host name of every rank: 'a,b,a,b', or run-length 'a:2,b:2' "
                             "(needed by placement node-local)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="override a config value, e.g. --set layout.buffers=2 (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="print the layout as JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Plan and print the layout; errors propagate to :func:`gflowdist.cli.main`."""
    from gflowdist.config import Config
    from gflowdist.errors import LayoutError
    from gflowdist.layout import parse_host_list, plan_layout

    config = Config.from_yaml(args.config, args.overrides)
    world_size = config.launch.nprocs if args.nprocs is None else args.nprocs
    hosts = parse_host_list(args.hosts) if args.hosts is not None else None
    if hosts is None and config.layout.placement == "node-local":
        raise LayoutError("placement 'node-local' needs the host name of every rank: pass "
                          "--hosts a,b,... or --hosts a:4,b:4")
    layout = plan_layout(world_size, config.layout, hosts)
    if args.json:
        print(json.dumps(layout.to_dict(), indent=2))
    else:
        print(layout.describe())
    return 0
