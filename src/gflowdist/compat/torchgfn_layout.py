"""torchgfn's ``RankLayout`` (its releases after 2.4.1), and what turns a layout object into gflowdist's.

Private helper of :mod:`gflowdist.compat.torchgfn` (import from there).

:class:`RankLayout` has torchgfn's constructor, attributes
(``training_ranks``, ``buffer_ranks``, ``agent_ranks_per_group``,
``num_training_ranks``, ``agent_group_size``, ``buffer_rank_set``,
``agent_group_rank_list``), queries (``assigned_buffer``,
``assigned_training_ranks``, ``agent_group_id``, ``summary``) and
constructors (``build``, ``from_hostnames``), with the same results and the
same log lines. Where torchgfn asserts (too few ranks, trainers not a
multiple of the agent groups, fewer trainers than buffers) it raises
:class:`~gflowdist.errors.LayoutError`, a ``ValueError`` that ``python -O``
cannot remove.

:func:`as_layout` accepts a torchgfn ``RankLayout`` (this one, or torchgfn's
own: any object with its attributes) or a :class:`gflowdist.layout.Layout`
and gives the gflowdist layout the contexts are built from.
"""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any

from gflowdist.errors import LayoutError
from gflowdist.layout import Layout, Role

__all__ = ["RankLayout", "as_layout"]

logger = logging.getLogger("gfn.utils.distributed")


def _split_ceil_floor(total: int, n: int) -> list[int]:
    """Split ``total`` into ``n`` parts; the first ``total % n`` get the ceiling, the rest the floor."""
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]


class RankLayout:
    """Rank layout for distributed training with optional buffer managers (torchgfn's).

    Each buffer group is a set of agent ranks plus one manager rank (the last
    rank of its chunk). Use :meth:`build` for arithmetic assignment or
    :meth:`from_hostnames` for hostname-aware node-local assignment.
    """

    def __init__(
        self,
        training_ranks: list[int],
        buffer_ranks: list[int],
        agent_ranks_per_group: list[list[int]],
        num_agent_groups: int,
    ):
        self.training_ranks = training_ranks
        self.buffer_ranks = buffer_ranks
        self.agent_ranks_per_group = agent_ranks_per_group
        self.num_training_ranks = len(training_ranks)
        self.agent_group_size = self.num_training_ranks // num_agent_groups
        self.buffer_rank_set = set(buffer_ranks)
        self.agent_group_rank_list = [
            training_ranks[i * self.agent_group_size : (i + 1) * self.agent_group_size] for i in range(num_agent_groups)
        ]
        self._rank_to_group: dict[int, int] = {}
        for g, members in enumerate(agent_ranks_per_group):
            for r in members:
                self._rank_to_group[r] = g
            if g < len(buffer_ranks):
                self._rank_to_group[buffer_ranks[g]] = g

    # --- per-rank queries ------------------------------------------------

    def assigned_buffer(self, rank: int) -> int | None:
        """Buffer manager rank of a training rank, or ``None``."""
        if not self.buffer_ranks:
            return None
        if rank in self.buffer_rank_set or rank not in self._rank_to_group:
            return None
        return self.buffer_ranks[self._rank_to_group[rank]]

    def assigned_training_ranks(self, rank: int) -> list[int] | None:
        """Training ranks a buffer rank manages, or ``None``."""
        if rank not in self.buffer_rank_set:
            return None
        return list(self.agent_ranks_per_group[self._rank_to_group[rank]])

    def agent_group_id(self, rank: int) -> int:
        """Agent-group index of ``rank``; a manager reports the group of its first agent, others 0."""
        if rank not in self._rank_to_group:
            return 0
        g = self._rank_to_group[rank]
        members = self.agent_ranks_per_group[g]
        if rank in self.buffer_rank_set:
            if not members:
                return 0
            rank = members[0]
        preceding = sum(len(m) for m in self.agent_ranks_per_group[:g])
        return (preceding + members.index(rank)) // self.agent_group_size

    def summary(self, num_nodes: int) -> str:
        """Human-readable layout summary for logging."""
        num_buffers = len(self.buffer_ranks)
        lines = [
            f"Total {num_nodes} node(s), {self.num_training_ranks} training rank(s), {num_buffers} buffer manager(s)."
        ]
        if num_buffers == 0:
            for i, members in enumerate(self.agent_ranks_per_group):
                lines.append(f"  Node {i}: Training ranks {members}.")
        else:
            for g in range(num_buffers):
                lines.append(
                    f"  Group {g}: Training ranks {self.agent_ranks_per_group[g]}. "
                    f"Buffer manager rank {self.buffer_ranks[g]}."
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"RankLayout(training_ranks={self.training_ranks}, buffer_ranks={self.buffer_ranks}, "
            f"agent_ranks_per_group={self.agent_ranks_per_group}, "
            f"num_agent_groups={len(self.agent_group_rank_list)})"
        )

    # --- constructors ----------------------------------------------------

    @classmethod
    def _from_chunks(cls, chunks: list[list[int]], num_agent_groups: int, no_buffers: bool = False) -> RankLayout:
        """From rank chunks (the last rank of each chunk is its manager unless ``no_buffers``)."""
        training_ranks: list[int] = []
        buffer_ranks: list[int] = []
        agent_ranks_per_group: list[list[int]] = []
        for chunk in chunks:
            agents = chunk if no_buffers else chunk[:-1]
            agent_ranks_per_group.append(list(agents))
            training_ranks.extend(agents)
            if not no_buffers:
                buffer_ranks.append(chunk[-1])
        if len(training_ranks) % num_agent_groups != 0:
            raise LayoutError(
                f"num_training_ranks ({len(training_ranks)}) must be divisible by num_agent_groups ({num_agent_groups})"
            )
        return cls(training_ranks, buffer_ranks, agent_ranks_per_group, num_agent_groups)

    @classmethod
    def build(
        cls,
        world_size: int,
        num_remote_buffers: int,
        num_nodes: int,
        num_agent_groups: int,
        num_coordinators: int,
    ) -> RankLayout:
        """Arithmetic assignment: ``B`` chunks of ``split(T, B)`` trainers, each followed by its buffer."""
        num_training = world_size - num_remote_buffers - num_coordinators
        if num_training <= 0:
            raise LayoutError(
                f"Not enough ranks: world_size={world_size}, buffers={num_remote_buffers}, "
                f"coordinators={num_coordinators}"
            )
        if num_remote_buffers > 0 and num_agent_groups % num_nodes != 0:
            logger.warning(
                "num_agent_groups (%d) is not a multiple of num_nodes (%d): "
                "some selective-averaging groups will span physical node boundaries.",
                num_agent_groups,
                num_nodes,
            )
        if num_remote_buffers == 0:
            chunks: list[list[int]] = []
            pos = 0
            for size in _split_ceil_floor(num_training, num_nodes):
                chunks.append(list(range(pos, pos + size)))
                pos += size
            return cls._from_chunks(chunks, num_agent_groups, no_buffers=True)
        if num_training < num_remote_buffers:
            raise LayoutError(f"num_training_ranks ({num_training}) < num_remote_buffers ({num_remote_buffers})")
        chunks = []
        pos = 0
        for n_agents in _split_ceil_floor(num_training, num_remote_buffers):
            chunks.append(list(range(pos, pos + n_agents + 1)))
            pos += n_agents + 1
        return cls._from_chunks(chunks, num_agent_groups)

    @classmethod
    def from_hostnames(
        cls,
        world_size: int,
        num_remote_buffers: int,
        num_agent_groups: int,
        num_coordinators: int,
        all_hostnames: list[str],
    ) -> RankLayout:
        """Node-local assignment when ``num_remote_buffers`` is a multiple of the hosts; else :meth:`build`.

        Needs at least one buffer (torchgfn divides by zero without one; use :meth:`build`).
        """
        if num_remote_buffers < 1:
            raise LayoutError(
                f"from_hostnames places buffer managers: num_remote_buffers must be at least 1, "
                f"got {num_remote_buffers} (use RankLayout.build without buffers)"
            )
        node_to_ranks: dict[str, list[int]] = {}
        for rank, hostname in enumerate(all_hostnames):
            node_to_ranks.setdefault(hostname, []).append(rank)
        sorted_nodes = sorted(node_to_ranks, key=lambda h: node_to_ranks[h][0])
        num_nodes = len(sorted_nodes)
        if num_remote_buffers % num_nodes != 0:
            logger.warning(
                "num_remote_buffers (%d) is not a multiple of num_nodes (%d): "
                "managers may be placed on different nodes than their agents. "
                "For node-local placement, use num_remote_buffers = k * num_nodes.",
                num_remote_buffers,
                num_nodes,
            )
            return cls.build(world_size, num_remote_buffers, num_nodes, num_agent_groups, num_coordinators)
        managers_per_node = num_remote_buffers // num_nodes
        logger.info("Hostname-based layout: %d node(s), %d manager(s)/node.", num_nodes, managers_per_node)
        coordinator_ranks = set(range(world_size - num_coordinators, world_size))
        per_node = [[r for r in sorted(node_to_ranks[h]) if r not in coordinator_ranks] for h in sorted_nodes]
        chunks: list[list[int]] = []
        for node_idx, node_ranks in enumerate(per_node):
            if len(node_ranks) < managers_per_node * 2:
                raise ValueError(
                    f"Node {sorted_nodes[node_idx]} has only {len(node_ranks)} rank(s), "
                    f"need at least {managers_per_node * 2} (1 agent + 1 manager per "
                    f"sub-group, {managers_per_node} sub-group(s))."
                )
            pos = 0
            for size in _split_ceil_floor(len(node_ranks), managers_per_node):
                chunks.append(node_ranks[pos : pos + size])
                pos += size
        layout = cls._from_chunks(chunks, num_agent_groups)
        if any(len({all_hostnames[r] for r in group}) > 1 for group in layout.agent_group_rank_list):
            logger.warning(
                "Some selective-averaging groups span physical node boundaries "
                "(num_agent_groups=%d, num_nodes=%d, uneven ranks per node).",
                num_agent_groups,
                num_nodes,
            )
        return layout


_RANK_LAYOUT_FIELDS = ("training_ranks", "buffer_ranks", "agent_ranks_per_group", "agent_group_rank_list")


def as_layout(layout: Any, world_size: int) -> Layout:
    """A gflowdist :class:`~gflowdist.layout.Layout` for ``layout`` over ``world_size`` ranks.

    ``layout`` is a gflowdist ``Layout`` (returned as it is) or a torchgfn
    ``RankLayout`` (gflowdist's or torchgfn's own). Every rank must be a
    trainer, a buffer, or the one coordinator, which torchgfn puts at rank
    ``world_size - 1``; anything else raises :class:`LayoutError` naming the
    ranks.
    """
    if isinstance(layout, Layout):
        if layout.world_size != world_size:
            raise LayoutError(f"the layout passed in is for {layout.world_size} ranks, this job has {world_size}")
        return layout
    missing = [name for name in _RANK_LAYOUT_FIELDS if not hasattr(layout, name)]
    if missing:
        raise TypeError(
            f"layout must be a torchgfn RankLayout or a gflowdist.layout.Layout, not {type(layout).__name__} "
            f"(it has no {', '.join(missing)})"
        )
    trainers = tuple(int(r) for r in layout.training_ranks)
    buffers = tuple(int(r) for r in layout.buffer_ranks)
    groups = tuple(tuple(int(r) for r in group) for group in layout.agent_group_rank_list)
    placed = [*trainers, *buffers]
    outside = [r for r in placed if not 0 <= r < world_size]
    if outside or len(set(placed)) != len(placed):
        raise LayoutError(f"the layout passed in places ranks {placed} in a world of {world_size} (each once)")
    left = sorted(set(range(world_size)) - set(placed))
    if left not in ([], [world_size - 1]):
        raise LayoutError(
            f"the layout passed in leaves ranks {left} without a role; only rank {world_size - 1} "
            "(the coordinator) may be left out"
        )
    if sorted(r for group in groups for r in group) != sorted(trainers) or not groups:
        raise LayoutError(f"the layout's agent groups {groups} do not cover its training ranks {list(trainers)}")
    coordinator = left[0] if left else None
    roles = [Role.TRAINER] * world_size
    for r in buffers:
        roles[r] = Role.BUFFER
    if coordinator is not None:
        roles[coordinator] = Role.COORDINATOR
    clients = {b: tuple(layout.assigned_training_ranks(b)) for b in buffers}
    buffer_of = {t: b for b, served in clients.items() for t in served}
    if buffers and sorted(buffer_of) != sorted(trainers):
        raise LayoutError("the layout passed in leaves training ranks without a buffer")
    group_of = {t: index for index, group in enumerate(groups) for t in group}
    return Layout(
        world_size=world_size,
        roles=tuple(roles),
        trainers=trainers,
        actors=(),
        buffers=buffers,
        coordinator=coordinator,
        buffer_of=MappingProxyType(buffer_of),
        clients_of=MappingProxyType(clients),
        agent_groups=groups,
        group_of=MappingProxyType(group_of),
        actors_of=MappingProxyType({t: () for t in trainers}),
        trainer_of=MappingProxyType({}),
        hosts=None,
        placement="given",
        note="a torchgfn RankLayout passed in",
    )
