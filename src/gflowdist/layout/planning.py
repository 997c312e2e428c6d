"""The rank-layout arithmetic: ``plan_layout(world_size, layout_cfg, hosts) -> Layout``.

Pure computation, no MPI, no torch.distributed: every rank of a job can run it
on the same inputs and get the same answer, and tests run it for thousands of
shapes in one process.

Notation: ``W`` ranks, ``T`` trainers, ``A`` actors, ``B`` buffers,
``I`` inference ranks, ``C`` coordinators (0 or 1), ``K = T + A`` clients (ranks a buffer serves),
``G`` agent groups. ``split(n, m)`` is ``m`` near-equal parts of ``n``, the
first ``n mod m`` one larger: ``split(5, 3) = [2, 2, 1]``.

1. **Counts** (:mod:`gflowdist.layout.counts`). ``W = T + A + B + I + C``. At most one count
   is ``"rest"``, which gets ``W - I - C - (the other two)``.
2. **Chunks.** The ranks other than the coordinator are cut into ``B`` chunks
   (one chunk without a buffer when ``B = 0``); a chunk is some client ranks
   followed by its buffer rank.

   * *block*: the coordinator is ``W - 1``; chunk ``i`` holds ``split(K, B)[i]``
     consecutive client ranks and then its buffer, chunks in rank order.
   * *node-local*: hosts are taken in order of their first rank; each host's
     ranks (minus the coordinator, still ``W - 1``) are cut into ``B / H``
     chunks of ``split(n_host, B / H)`` consecutive ranks whose *last* rank is
     the buffer. Needs ``B`` a multiple of the ``H`` hosts, every chunk at least
     one client, and client counts over all buffers differing by at most one.
3. **Trainers in chunks.** Trainers are dealt to the chunks round-robin
   (chunk 0, 1, ..., B-1, 0, ...), skipping full chunks; node-local placement
   deals to the first chunk of every host, then the second of every host, and
   so on. Within a chunk the first ``t_i`` client ranks are trainers, the rest
   actors. In block placement
   no chunk is ever full before the deal ends, so ``t_i = split(T, B)[i]``:
   with ``A = 0`` this is exactly torchgfn's rule (W=8, B=3, C=0: trainers
   0,1 -> buffer 2; 3,4 -> 5; 6 -> 7).
4. **Agent groups.** ``G`` consecutive slices of ``T / G`` trainers (placement
   order); ``T`` must be a multiple of ``G``.
5. **Actors to trainers.** With trainers ``t_0..t_{T-1}`` and actors
   ``a_0..a_{A-1}`` in placement order, actor ``a_j`` gets its weights from
   trainer ``t_{floor(j T / A)}``: a trainer serves ``floor(A/T)`` or
   ``ceil(A/T)`` actors, and consecutive actors share a trainer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gflowdist.config.sections import LayoutConfig
from gflowdist.errors import LayoutError
from gflowdist.layout.counts import (
    LayoutCounts,
    as_layout_config,
    counted,
    describe_fit,
    fitting_world_sizes,
    resolve_counts,
    split_evenly,
)
from gflowdist.layout.model import Layout, Role

# the counts (step 1) are gflowdist.layout.counts'; named here too, as before
__all__ = ["plan_layout", "split_evenly", "resolve_counts", "LayoutCounts", "fitting_world_sizes", "describe_fit"]


@dataclass
class _Chunk:
    """Client ranks (ascending) and the buffer rank that serves them (``None``: no buffers).

    ``deal_key`` orders the trainer deal: ``(chunk index within its host, host index)``,
    so node-local placement hands trainers to every host before a host's second chunk.
    """

    clients: list[int]
    buffer: int | None
    deal_key: tuple[int, int]
    trainers: int = field(default=0)


def _block_chunks(counts: LayoutCounts) -> list[_Chunk]:
    if counts.buffers == 0:
        return [_Chunk(list(range(counts.clients)), None, (0, 0))]
    chunks = []
    start = 0
    for index, size in enumerate(split_evenly(counts.clients, counts.buffers)):
        chunks.append(_Chunk(list(range(start, start + size)), start + size, (index, 0)))
        start += size + 1
    return chunks


def _node_local_chunks(
    world_size: int, counts: LayoutCounts, hosts: tuple[str, ...] | None, coordinator: int | None
) -> list[_Chunk]:
    if hosts is None:
        raise LayoutError("placement 'node-local' needs the host name of every rank, but none were given")
    if counts.buffers == 0:
        return _block_chunks(counts)
    host_order = list(dict.fromkeys(hosts))
    if counts.buffers % len(host_order):
        raise LayoutError(
            f"placement 'node-local' needs the number of buffers ({counts.buffers}) to be a "
            f"multiple of the number of hosts ({len(host_order)}: {', '.join(host_order)})"
        )
    per_host = counts.buffers // len(host_order)
    chunks: list[_Chunk] = []
    for host_index, host in enumerate(host_order):
        ranks = [rank for rank in range(world_size) if hosts[rank] == host and rank != coordinator]
        if len(ranks) < 2 * per_host:
            raise LayoutError(
                f"placement 'node-local': host '{host}' has {counted(len(ranks), 'rank')} besides "
                f"the coordinator, but placing {counted(per_host, 'buffer')} on each host needs "
                f"at least {2 * per_host} there (each buffer plus one client)"
            )
        start = 0
        for index, size in enumerate(split_evenly(len(ranks), per_host)):
            part = ranks[start : start + size]
            chunks.append(_Chunk(part[:-1], part[-1], (index, host_index)))
            start += size
    loads = [len(chunk.clients) for chunk in chunks]
    if max(loads) - min(loads) > 1:
        busiest = chunks[loads.index(max(loads))]
        idlest = chunks[loads.index(min(loads))]
        busiest_host, idlest_host = (hosts[c.buffer] if c.buffer is not None else "?" for c in (busiest, idlest))
        raise LayoutError(
            "placement 'node-local' would give buffers unequal loads: "
            f"buffer {busiest.buffer} on '{busiest_host}' would serve "
            f"{counted(max(loads), 'client')} but buffer {idlest.buffer} on "
            f"'{idlest_host}' {min(loads)}; clients per buffer must differ by at most "
            "one (spread the ranks evenly over the hosts, or use placement 'block')"
        )
    return chunks


def _deal_trainers(chunks: list[_Chunk], trainers: int) -> None:
    """Round-robin over the chunks in deal order, skipping full ones (capacities sum to >= T)."""
    order = sorted(chunks, key=lambda chunk: chunk.deal_key)
    left = trainers
    while left:
        before = left
        for chunk in order:
            if left and chunk.trainers < len(chunk.clients):
                chunk.trainers += 1
                left -= 1
        if left == before:
            raise LayoutError(
                f"internal error: {counted(left, 'trainer')} did not fit in the "
                f"{sum(len(chunk.clients) for chunk in chunks)} client slots"
            )


def _check_hosts(world_size: int, hosts: Sequence[str] | None) -> tuple[str, ...] | None:
    if hosts is None:
        return None
    if isinstance(hosts, str):
        raise LayoutError("hosts must be a list with one host name per rank, found a string")
    names = tuple(hosts)
    if len(names) != world_size:
        raise LayoutError(
            f"hosts lists {counted(len(names), 'name')} but the job has "
            f"{counted(world_size, 'rank')}; give one host name per rank"
        )
    for rank, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise LayoutError(f"host name of rank {rank} must be a non-empty string, found {name!r}")
    return names


def _assemble(
    world_size: int,
    counts: LayoutCounts,
    groups: int,
    chunks: list[_Chunk],
    coordinator: int | None,
    hosts: tuple[str, ...] | None,
    placement: str,
    note: str | None,
) -> Layout:
    _deal_trainers(chunks, counts.trainers)
    roles: list[Role | None] = [None] * world_size
    trainers: list[int] = []
    actors: list[int] = []
    buffers: list[int] = []
    buffer_of: dict[int, int] = {}
    clients_of: dict[int, tuple[int, ...]] = {}
    for chunk in chunks:
        trainers += chunk.clients[: chunk.trainers]
        actors += chunk.clients[chunk.trainers :]
        if chunk.buffer is not None:
            buffers.append(chunk.buffer)
            clients_of[chunk.buffer] = tuple(chunk.clients)
            buffer_of.update({client: chunk.buffer for client in chunk.clients})
    for rank in trainers:
        roles[rank] = Role.TRAINER
    for rank in actors:
        roles[rank] = Role.ACTOR
    for rank in buffers:
        roles[rank] = Role.BUFFER
    if coordinator is not None:
        roles[coordinator] = Role.COORDINATOR
    size = len(trainers) // groups
    agent_groups = tuple(tuple(trainers[index * size : (index + 1) * size]) for index in range(groups))
    group_of = {rank: index for index, group in enumerate(agent_groups) for rank in group}
    trainer_of = {actor: trainers[index * len(trainers) // len(actors)] for index, actor in enumerate(actors)}
    served: dict[int, list[int]] = {trainer: [] for trainer in trainers}
    for actor in actors:
        served[trainer_of[actor]].append(actor)
    actors_of = {trainer: tuple(its_actors) for trainer, its_actors in served.items()}
    inference = _place_inference(world_size, counts, coordinator, actors_of, roles, trainer_of)
    unassigned = [rank for rank, role in enumerate(roles) if role is None]
    if unassigned:
        raise LayoutError(f"internal error: ranks {unassigned} got no role")
    return Layout(
        world_size=world_size,
        roles=tuple(role for role in roles if role is not None),  # all set, checked above
        trainers=tuple(trainers),
        actors=tuple(actors),
        buffers=tuple(buffers),
        coordinator=coordinator,
        buffer_of=MappingProxyType(buffer_of),
        clients_of=MappingProxyType(clients_of),
        agent_groups=agent_groups,
        group_of=MappingProxyType(group_of),
        actors_of=MappingProxyType(actors_of),
        trainer_of=MappingProxyType(trainer_of),
        hosts=hosts,
        placement=placement,
        note=note,
        inference=tuple(inference.ranks),
        inference_of=MappingProxyType(inference.of),
        served_by=MappingProxyType(inference.served),
    )


@dataclass
class _Inference:
    ranks: list[int] = field(default_factory=list)
    of: dict[int, int] = field(default_factory=dict)  # actor -> its inference rank
    served: dict[int, tuple[int, ...]] = field(default_factory=dict)  # inference rank -> its actors


def _place_inference(
    world_size: int,
    counts: LayoutCounts,
    coordinator: int | None,
    actors_of: dict[int, tuple[int, ...]],
    roles: list[Role | None],
    trainer_of: dict[int, int],
) -> _Inference:
    """Rule 6 of the module docstring; sets the inference ranks' roles and trainers."""
    placed = _Inference()
    if not counts.inference:
        return placed
    end = coordinator if coordinator is not None else world_size
    placed.ranks = list(range(end - counts.inference, end))
    feeding = [trainer for trainer, actors in actors_of.items() if actors]
    if counts.inference < len(feeding):
        raise LayoutError(
            f"layout.inference is {counts.inference} but {counted(len(feeding), 'trainer')} have actors: an "
            "inference rank holds one trainer's weights, so each such trainer needs at least one"
        )
    ranks = iter(placed.ranks)
    for trainer, share in zip(feeding, split_evenly(counts.inference, len(feeding)), strict=True):
        if share > len(actors_of[trainer]):
            raise LayoutError(
                f"layout.inference is {counts.inference}: trainer {trainer} would get {share} inference ranks "
                f"for its {counted(len(actors_of[trainer]), 'actor')}; every inference rank serves at least one actor"
            )
        start = 0
        for size in split_evenly(len(actors_of[trainer]), share):
            rank = next(ranks)
            roles[rank] = Role.INFERENCE
            trainer_of[rank] = trainer
            placed.served[rank] = actors_of[trainer][start : start + size]
            placed.of.update({actor: rank for actor in placed.served[rank]})
            start += size
    return placed


def plan_layout(
    world_size: int,
    layout_cfg: LayoutConfig | Mapping[str, Any],
    hosts: Sequence[str] | None = None,
    *,
    fallback_to_block: bool = False,
) -> Layout:
    """The role of every rank for a job of ``world_size`` ranks (rules in the module docstring).

    ``layout_cfg`` is a :class:`~gflowdist.config.LayoutConfig` or a mapping of its
    keys; ``hosts`` is the host name of every rank (needed by ``node-local``
    placement, shown by :meth:`Layout.describe` otherwise). With
    ``fallback_to_block=True`` (torchgfn entry points), a node-local placement
    that the hosts do not allow becomes block placement and ``Layout.note`` says
    why; otherwise that is a :class:`LayoutError` like every impossible layout.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise LayoutError(f"world size must be an integer >= 1, found {world_size!r}")
    config = as_layout_config(layout_cfg)
    host_names = _check_hosts(world_size, hosts)
    counts = resolve_counts(world_size, config)
    coordinator = world_size - 1 if counts.coordinator else None
    note = None
    placement = config.placement
    if placement == "node-local" and counts.inference:
        raise LayoutError(
            f"layout.inference is {counts.inference}: inference ranks take block placement only "
            "(placement 'node-local' does not place them yet)"
        )
    if placement == "node-local":
        try:
            chunks = _node_local_chunks(world_size, counts, host_names, coordinator)
        except LayoutError as err:
            if not fallback_to_block:
                raise
            note = f"{err}; fell back to block placement"
            placement = "block"
            chunks = _block_chunks(counts)
    else:
        chunks = _block_chunks(counts)
    return _assemble(world_size, counts, config.agent_groups, chunks, coordinator, host_names, placement, note)
