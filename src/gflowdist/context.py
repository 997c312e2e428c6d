"""DistributedContext: the layout of a job plus the communicators of each rank's roles.

Built on every rank from the same layout config and the world communicator::

    ctx = DistributedContext.create({"buffers": 1, "coordinator": True})
    ctx.role                  # Role.TRAINER
    ctx.placement.buffer      # my buffer rank
    ctx.comm("DP")            # my agent group (None for ranks outside it)
    ctx.cleanup()

Creation is collective over the world: each rank gathers every rank's host
name, plans the layout (pure arithmetic, :func:`gflowdist.layout.plan_layout`)
and compares a digest of it with every other rank *before* any sub-group is
created, so ranks started with different configs fail with one
:class:`~gflowdist.errors.LayoutError` instead of hanging in a split.

Named communicators (None on ranks that are not members):

============  =====================================================
``world``     every rank
``trainers``  every trainer
``DP``        my agent group (the trainers that average together)
``POP``       the first trainer of every agent group
``buffers``   every buffer rank
============  =====================================================

With ``device`` (this rank's ``"cpu"`` or ``"cuda:N"``, as ``gflowdist run`` gives it)
creation also gathers every rank's device and chooses, for each agent group, how
it averages (:func:`gflowdist.devices.choose_averaging`): ``ctx.devices`` and
``ctx.averaging``. On the torch engine an agent group chosen for nccl gets an nccl
process group; every other communicator is gloo.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gflowdist.comm import Communicator, world_comm
from gflowdist.devices import AveragingChoice, choose_averaging
from gflowdist.errors import LayoutError
from gflowdist.layout import Layout, RankPlacement, Role, plan_layout

__all__ = ["DistributedContext", "COMM_NAMES"]

COMM_NAMES = ("world", "trainers", "DP", "POP", "buffers")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class DistributedContext:
    """My role, my peers and my sub-communicators (see the module docstring)."""

    def __init__(self, world: Communicator, layout: Layout, comms: Mapping[str, Communicator | None]):
        self.world = world
        self.layout = layout
        self.placement: RankPlacement = layout.for_rank(world.rank)
        self._comms = dict(comms)
        self._cleaned = False
        #: every rank's device, by world rank (empty unless create() was given one)
        self.devices: list[str] = []
        #: how each agent group averages, by group index (empty unless create() was given a device)
        self.averaging: list[AveragingChoice] = []

    @classmethod
    def create(
        cls,
        layout_cfg: Any,
        *,
        comm: Communicator | None = None,
        fallback_to_block: bool = False,
        device: str | None = None,
    ) -> DistributedContext:
        """Plan the layout on every rank, check that all ranks agree, then split.

        ``layout_cfg`` is a :class:`~gflowdist.config.LayoutConfig` or a
        mapping of its keys. Collective over ``comm`` (default: the world).
        """
        world = comm if comm is not None else world_comm()
        hosts = [h.decode() for h in world.all_gather_bytes(world.host.encode())]
        layout: Layout | None = None
        try:
            layout = plan_layout(world.size, layout_cfg, hosts, fallback_to_block=fallback_to_block)
            mine = json.dumps(layout.to_dict(), sort_keys=True)
        except LayoutError as err:
            mine = f"error: {err}"
        statements = [s.decode() for s in world.all_gather_bytes(mine.encode())]
        if layout is None or len(set(statements)) > 1:
            raise LayoutError(cls._disagreement(statements, world.rank))
        devices = [d.decode() for d in world.all_gather_bytes(device.encode())] if device is not None else []
        averaging = (
            [
                choose_averaging(world.engine, [(r, layout.host_of(r) or hosts[r], devices[r]) for r in group])
                for group in layout.agent_groups
            ]
            if devices
            else []
        )
        comms: dict[str, Communicator | None] = {"world": world}
        # Every rank takes part in every split, in this fixed order.
        comms["trainers"] = world.split([list(layout.trainers)])
        groups = [list(g) for g in layout.agent_groups]
        if any(choice.path == "nccl" for choice in averaging):  # the torch engine only (choose_averaging)
            # the torch engine only (choose_averaging): TorchComm.split takes a backend per group
            backends = ["nccl" if c.path == "nccl" else "gloo" for c in averaging]
            comms["DP"] = world.split(groups, backends=backends)  # type: ignore[call-arg]
        else:
            comms["DP"] = world.split(groups)
        comms["POP"] = world.split([list(layout.pop_ranks)])
        comms["buffers"] = world.split([list(layout.buffers)]) if layout.buffers else None
        ctx = cls(world, layout, comms)
        ctx.devices, ctx.averaging = devices, averaging
        return ctx

    @staticmethod
    def _disagreement(statements: list[str], rank: int) -> str:
        errors = [(r, s) for r, s in enumerate(statements) if s.startswith("error: ")]
        if errors and len({s for _, s in errors}) == 1 and len(errors) == len(statements):
            return errors[0][1][len("error: ") :]
        groups: dict[str, list[int]] = {}
        for r, s in enumerate(statements):
            groups.setdefault(s, []).append(r)
        parts = []
        for s, ranks in groups.items():
            what = s if s.startswith("error: ") else f"layout digest {_digest(s).hex()[:10]}"
            parts.append(f"ranks {ranks}: {what}")
        return (
            "the ranks of this job planned different layouts (were they started with different "
            "configs or world sizes?): " + "; ".join(parts)
        )

    # -- who am I -----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def role(self) -> Role:
        return self.placement.role

    @property
    def host(self) -> str:
        return self.placement.host or self.world.host

    @property
    def agent_group(self) -> Communicator | None:
        """My agent group: the trainers I average with (``comm("DP")``; None outside one)."""
        return self._comms.get("DP")

    def comm(self, name: str) -> Communicator | None:
        """The named communicator (see the module docstring), or None if I am not a member."""
        if name not in COMM_NAMES:
            raise KeyError(f"unknown communicator {name!r}; expected one of {', '.join(COMM_NAMES)}")
        return self._comms.get(name)

    def describe_rank(self, rank: int) -> str:
        """``"rank 3 (buffer on node-b)"``: for messages about a peer."""
        from gflowdist.errors import describe_peer

        return describe_peer(rank, self.layout.role_of(rank).value, self.layout.host_of(rank))

    def cleanup(self) -> None:
        """Free every sub-communicator this context created (idempotent; the world is not freed)."""
        if self._cleaned:
            return
        self._cleaned = True
        for name, comm in self._comms.items():
            if comm is not None and name != "world":
                comm.free()

    def __repr__(self) -> str:
        return f"<DistributedContext rank {self.rank}/{self.size} {self.role.value}>"
