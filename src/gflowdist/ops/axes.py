"""Named axes: EvoRL-style names for the groups a collective runs over.

EvoRL (JAX) names mapped axes: ``pmean(x, "DP")`` averages over the
data-parallel axis. Here an axis name stands for a communicator:

- ``"DP"`` (:data:`DP_AXIS_NAME`): the trainers of one agent group (they
  average gradients with each other);
- ``"POP"`` (:data:`POP_AXIS_NAME`): the population axis, across agent groups.

A distributed context binds them (:func:`bind_axis`) when it builds its
groups. Unbound, both mean the whole world, which is right for a job
without groups. Any other name must be bound first; a communicator or a native group (torch process group,
mpi4py communicator) can also be passed directly wherever an axis name is
accepted.
"""

from __future__ import annotations

from gflowdist.comm.base import Communicator
from gflowdist.comm.native import Group, is_native_group
from gflowdist.comm.session import current_session
from gflowdist.errors import ConfigError
from gflowdist.ops.collectives import group_or_world

__all__ = ["DP_AXIS_NAME", "POP_AXIS_NAME", "bind_axis", "unbind_axis", "axis_group"]

DP_AXIS_NAME = "DP"
POP_AXIS_NAME = "POP"


def bind_axis(name: str, group: Group) -> None:
    """Make axis ``name`` mean ``group`` in this job's session (replaces an earlier binding).

    The binding lives in :class:`gflowdist.comm.session.Session` (a process, or
    a rank that is a thread), and ends when the session closes.

    ``group`` is a :class:`Communicator` or a native group (torch process
    group, mpi4py communicator), which is wrapped now: a collective over it.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"axis name must be a non-empty string, got {name!r}")
    if group is None:
        raise TypeError(f"bind_axis({name!r}, ...) needs a group, not None")
    current_session().axes[name] = group_or_world(group, f"bind_axis({name!r})")


def unbind_axis(name: str) -> None:
    """Forget the binding of ``name`` (DP and POP fall back to the world)."""
    current_session().axes.pop(name, None)


def axis_group(axis: str | Group) -> Communicator:
    """The communicator behind an axis name (or the group itself, as a communicator)."""
    if isinstance(axis, Communicator) or is_native_group(axis):
        return group_or_world(axis, "axis_group")
    bound = current_session().axes
    if axis in bound:
        return bound[axis]
    if axis in (DP_AXIS_NAME, POP_AXIS_NAME):
        return group_or_world(None)
    raise ConfigError(
        f"unknown axis {axis!r}: bind it with gflowdist.ops.axes.bind_axis(name, group) "
        f"(bound: {sorted(bound) or 'none'}; DP and POP default to the world)",
        key="axis_name",
    )
