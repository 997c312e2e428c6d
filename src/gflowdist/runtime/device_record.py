"""Where a run computed and how its agent groups averaged, in the run directory and the report.

``devices.json`` (written by the collector at start-up)::

    {"engine": "mpi",
     "devices": {"0": "cuda:0", "1": "cuda:0", "2": "cpu", ...},        # by world rank
     "averaging": [{"group": 0, "ranks": [0, 1], "path": "host", "engine": "mpi",
                    "reason": "ranks 0 and 1 share cuda:0 on node-a (nccl refuses two ranks on one GPU)"}]}

The report's notes say the same in a line per agent group of several trainers
with one on a GPU (a CPU-only run's report is unchanged).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gflowdist.context import DistributedContext

__all__ = ["DEVICES_FILE", "devices_record", "write_devices", "device_notes"]

DEVICES_FILE = "devices.json"


def devices_record(ctx: DistributedContext) -> dict[str, Any]:
    """What ``devices.json`` holds (see the module doc)."""
    return {
        "engine": ctx.world.engine,
        "devices": {str(rank): device for rank, device in enumerate(ctx.devices)},
        "averaging": [
            {"group": i, "ranks": list(group), "path": c.path, "engine": c.engine, "reason": c.reason}
            for i, (group, c) in enumerate(zip(ctx.layout.agent_groups, ctx.averaging, strict=True))
        ],
    }


def write_devices(run_dir: Path, ctx: DistributedContext) -> Path | None:
    """``run_dir/devices.json``; None (nothing written) when the context knows no devices."""
    if not ctx.devices:
        return None
    path = run_dir / DEVICES_FILE
    path.write_text(json.dumps(devices_record(ctx), indent=1) + "\n")
    return path


def device_notes(ctx: DistributedContext) -> list[str]:
    """The report's lines: how each agent group of several trainers, one on a GPU, averaged, and why."""
    notes: list[str] = []
    if not ctx.averaging:
        return notes
    for i, (group, choice) in enumerate(zip(ctx.layout.agent_groups, ctx.averaging, strict=True)):
        devices = sorted({ctx.devices[r] for r in group})
        if devices == ["cpu"] or choice.path == "none":  # a CPU-only group, a group of one: nothing new to say
            continue
        on = ", ".join(devices)
        notes.append(
            f"agent group {i} (trainers {', '.join(map(str, group))} on {on}) averages through {choice.describe()}"
        )
    return notes
