"""Pinning a worker to one CPU (``bind_to_core`` for launchers that cannot bind).

torchrun has no per-core binding, so :func:`gflowdist.launch.fork` asks its
workers to pin themselves: it sets ``GFLOWDIST_BIND_TO=core`` (or
``hwthread``) in their environment and each worker, on its next call to
``fork``, restricts itself to CPU ``cpus[local_rank % len(cpus)]`` where
``cpus`` lists, among the CPUs this process may use,

- ``core``: one hardware thread per physical core (the first sibling), the
  meaning of ``mpiexec -bind-to core``;
- ``hwthread``: every hardware thread (Open MPI's ``--use-hwthread-cpus``).

The topology comes from ``/sys/devices/system/cpu/cpu*/topology``; where it
cannot be read every CPU counts as a core.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BIND_VARIABLE", "binding_cpus", "bind_to_cpu", "bind_from_environment"]

BIND_VARIABLE = "GFLOWDIST_BIND_TO"
_SYS_CPU = Path("/sys/devices/system/cpu")


def _first_sibling(cpu: int) -> int:
    path = _SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        text = path.read_text().strip()
    except OSError:
        return cpu
    first = text.replace("-", ",").split(",")[0]
    return int(first) if first.isdigit() else cpu


def binding_cpus(unit: str) -> list[int]:
    """The CPUs workers are spread over: ``"core"`` (one per physical core) or ``"hwthread"``."""
    if unit not in ("core", "hwthread"):
        raise ValueError(f"bind unit must be 'core' or 'hwthread', got {unit!r}")
    allowed = sorted(os.sched_getaffinity(0))
    if unit == "hwthread":
        return allowed
    return sorted({_first_sibling(cpu) for cpu in allowed} & set(allowed)) or allowed


def bind_to_cpu(local_rank: int, unit: str) -> int:
    """Pin this process to ``binding_cpus(unit)[local_rank % count]``; returns that CPU."""
    cpus = binding_cpus(unit)
    cpu = cpus[local_rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


def bind_from_environment() -> int | None:
    """Apply ``GFLOWDIST_BIND_TO`` (set by our launcher) once; returns the CPU, or None when unset."""
    unit = os.environ.pop(BIND_VARIABLE, None)
    if unit is None:
        return None
    return bind_to_cpu(int(os.environ.get("LOCAL_RANK", "0")), unit)
