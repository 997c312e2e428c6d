"""Rank layout: which rank trains, acts, buffers or coordinates, and who serves whom.

    from gflowdist.layout import plan_layout, Role
    layout = plan_layout(8, {"buffers": 3, "coordinator": False})
    layout.buffer_of[0]       # 2
    layout.role_of(7)         # Role.BUFFER
    print(layout.describe())

Pure arithmetic (no MPI, no torch.distributed); the rules and worked examples
are in docs/layout.md, :mod:`gflowdist.layout.counts` and :mod:`gflowdist.layout.planning`.
"""

from __future__ import annotations

from gflowdist.layout.counts import LayoutCounts, describe_fit, fitting_world_sizes, resolve_counts, split_evenly
from gflowdist.layout.hosts import parse_host_list
from gflowdist.layout.model import Layout, RankPlacement, Role
from gflowdist.layout.planning import plan_layout

__all__ = [
    "Role",
    "Layout",
    "RankPlacement",
    "LayoutCounts",
    "plan_layout",
    "resolve_counts",
    "split_evenly",
    "fitting_world_sizes",
    "describe_fit",
    "parse_host_list",
]
