"""plan_layout over a matrix of world sizes, role mixes, placements and host lists.

Every layout is checked against invariants (one role per rank, balanced
assignments, groups partition the trainers, ...). Block placement without
actors is compared with an independent, straightforward reimplementation of
torchgfn's rule, and validity is predicted independently of the code under test.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from gflowdist.errors import LayoutError
from gflowdist.layout import Layout, Role, plan_layout, split_evenly

WORLD_SIZES = list(range(1, 65))


def mixes(world: int, groups: tuple[int, ...] = (1, 2, 3, 4)) -> list[tuple[int, int, int, int]]:
    """(buffers, actors, coordinator, groups) combinations tried for one world size."""
    buffer_counts = sorted({0, 1, 2, 3, 4, 5, world // 4, world // 2})
    actor_counts = sorted({0, 1, 2, 3, world // 3, world // 2})
    return [(b, a, c, g) for b in buffer_counts for a in actor_counts for c in (0, 1) for g in groups]


def expected_valid(world: int, buffers: int, actors: int, coordinator: int, groups: int) -> bool:
    trainers = world - buffers - actors - coordinator
    return trainers >= 1 and trainers % groups == 0 and not (actors and not buffers) and buffers <= trainers + actors


def torchgfn_reference(world: int, buffers: int, coordinator: int) -> dict[str, object]:
    """torchgfn's block rule written out plainly (no shared code with gflowdist)."""
    trainers_total = world - buffers - coordinator
    trainers: list[int] = []
    buffer_ranks: list[int] = []
    assigned: dict[int, int] = {}
    if buffers == 0:
        trainers = list(range(trainers_total))
    else:
        rank = 0
        for chunk in range(buffers):
            size = trainers_total // buffers
            if chunk < trainers_total % buffers:
                size += 1
            members = list(range(rank, rank + size))
            buffer_rank = rank + size
            for member in members:
                assigned[member] = buffer_rank
            trainers += members
            buffer_ranks.append(buffer_rank)
            rank = buffer_rank + 1
    return {
        "trainers": trainers,
        "buffers": buffer_ranks,
        "assigned": assigned,
        "coordinator": world - 1 if coordinator else None,
    }


def check_invariants(
    layout: Layout, world: int, trainers: int, actors: int, buffers: int, coordinator: int, groups: int
) -> None:
    # every rank exactly one role, and the lists agree with the roles
    assert len(layout.roles) == world
    listed = (
        list(layout.trainers)
        + list(layout.actors)
        + list(layout.buffers)
        + ([layout.coordinator] if layout.coordinator is not None else [])
    )
    assert sorted(listed) == list(range(world))
    assert (
        Counter(layout.roles)
        == Counter({Role.TRAINER: trainers, Role.ACTOR: actors, Role.BUFFER: buffers, Role.COORDINATOR: coordinator})
        - Counter()
    )
    for role in Role:
        assert all(layout.roles[rank] is role for rank in layout.ranks_of(role))
    assert layout.coordinator == (world - 1 if coordinator else None)
    clients = set(layout.trainers) | set(layout.actors)
    # buffer assignment: every client one buffer, loads differ by at most one, >= 1 each
    if buffers:
        assert set(layout.buffer_of) == clients
        assert set(layout.clients_of) == set(layout.buffers)
        loads = [len(layout.clients_of[b]) for b in layout.buffers]
        assert min(loads) >= 1 and max(loads) - min(loads) <= 1
        for buffer_rank, served in layout.clients_of.items():
            assert all(layout.buffer_of[client] == buffer_rank for client in served)
        assert sum(loads) == len(clients)
    else:
        assert not layout.buffer_of and not layout.clients_of
    # agent groups partition the trainers into equal consecutive slices
    assert len(layout.agent_groups) == groups
    assert [r for group in layout.agent_groups for r in group] == list(layout.trainers)
    assert {len(group) for group in layout.agent_groups} == {trainers // groups}
    assert all(layout.group_of[r] == index for index, group in enumerate(layout.agent_groups) for r in group)
    assert layout.pop_ranks == tuple(group[0] for group in layout.agent_groups)
    # actors: one trainer each, trainers serve floor(A/T) or ceil(A/T)
    assert set(layout.trainer_of) == set(layout.actors)
    assert set(layout.actors_of) == set(layout.trainers)
    served = [len(layout.actors_of[t]) for t in layout.trainers]
    assert sum(served) == actors and max(served) - min(served) <= 1
    for trainer, its_actors in layout.actors_of.items():
        assert all(layout.trainer_of[a] == trainer for a in its_actors)
    # one rank's view agrees with the tables (first, middle and last rank)
    for rank in sorted({0, world // 2, world - 1}):
        view = layout.for_rank(rank)
        assert view.role is layout.roles[rank]
        assert view.buffer == layout.buffer_of.get(rank)
        if view.role is Role.ACTOR:
            assert view.group == layout.group_of[layout.trainer_of[rank]]


def check_block_structure(layout: Layout, trainers: int, buffers: int) -> None:
    """Block: each buffer directly follows its clients, trainers first; t_i = split(T, B)[i]."""
    if not buffers:
        return
    per_buffer = []
    for buffer_rank in layout.buffers:
        served = layout.clients_of[buffer_rank]
        assert served == tuple(range(buffer_rank - len(served), buffer_rank))
        kinds = [layout.roles[r] for r in served]
        assert kinds == sorted(kinds, key=lambda role: role is Role.ACTOR)
        per_buffer.append(kinds.count(Role.TRAINER))
    assert per_buffer == split_evenly(trainers, buffers)


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_block_matrix(world: int) -> None:
    for buffers, actors, coordinator, groups in mixes(world):
        cfg = {"buffers": buffers, "actors": actors, "coordinator": bool(coordinator), "agent_groups": groups}
        trainers = world - buffers - actors - coordinator
        if not expected_valid(world, buffers, actors, coordinator, groups):
            with pytest.raises(LayoutError):
                plan_layout(world, cfg)
            continue
        layout = plan_layout(world, cfg)
        check_invariants(layout, world, trainers, actors, buffers, coordinator, groups)
        check_block_structure(layout, trainers, buffers)
        if actors == 0:
            reference = torchgfn_reference(world, buffers, coordinator)
            assert list(layout.trainers) == reference["trainers"]
            assert list(layout.buffers) == reference["buffers"]
            assert dict(layout.buffer_of) == reference["assigned"]
            assert layout.coordinator == reference["coordinator"]
            size = trainers // groups
            ref_trainers = reference["trainers"]
            assert layout.agent_groups == tuple(tuple(ref_trainers[i * size : (i + 1) * size]) for i in range(groups))
        if groups > 1:
            continue
        # the same counts written without "rest", or with "rest" on another role
        explicit = plan_layout(world, {**cfg, "trainers": trainers})
        assert explicit == layout
        rest_on_actors = plan_layout(world, {**cfg, "trainers": trainers, "actors": "rest"})
        assert rest_on_actors == layout


def random_hosts(rng: random.Random, world: int) -> list[str]:
    count = rng.randint(1, min(4, world))
    names = [f"node{i}" for i in range(count)]
    if rng.random() < 0.5:  # contiguous blocks, as a hostfile usually gives
        sizes = split_evenly(world, count) if rng.random() < 0.5 else None
        if sizes is None:
            cuts = sorted(rng.sample(range(1, world), count - 1)) if count > 1 else []
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, world], strict=False)]
        return [name for name, size in zip(names, sizes, strict=False) for _ in range(size)]
    hosts = names + [rng.choice(names) for _ in range(world - count)]  # round-robin-ish
    rng.shuffle(hosts)
    return hosts


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_node_local_matrix(world: int) -> None:
    rng = random.Random(1000 + world)
    for _ in range(3):
        hosts = random_hosts(rng, world)
        host_names = list(dict.fromkeys(hosts))
        for buffers, actors, coordinator, groups in mixes(world, groups=(1, 2)):
            cfg = {
                "buffers": buffers,
                "actors": actors,
                "coordinator": bool(coordinator),
                "agent_groups": groups,
                "placement": "node-local",
            }
            trainers = world - buffers - actors - coordinator
            if not expected_valid(world, buffers, actors, coordinator, groups):
                with pytest.raises(LayoutError):
                    plan_layout(world, cfg, hosts)
                continue
            per_host = buffers // len(host_names)
            sizes = {
                h: sum(1 for r, name in enumerate(hosts) if name == h and not (coordinator and r == world - 1))
                for h in host_names
            }
            must_fail = buffers % len(host_names) != 0 or any(size < 2 * per_host for size in sizes.values())
            must_work = buffers == 0 or (not must_fail and len(set(sizes.values())) == 1)
            try:
                layout = plan_layout(world, cfg, hosts)
            except LayoutError as err:
                assert not must_work, f"{cfg} {hosts}: {err}"
                assert "node-local" in str(err)
                fallback = plan_layout(world, cfg, hosts, fallback_to_block=True)
                assert fallback.placement == "block" and "fell back to block" in fallback.note
                block = plan_layout(world, {**cfg, "placement": "block"}, hosts)
                assert fallback.roles == block.roles
                assert dict(fallback.buffer_of) == dict(block.buffer_of)
                check_invariants(fallback, world, trainers, actors, buffers, coordinator, groups)
                continue
            assert not must_fail, f"{cfg} {hosts} should have failed"
            assert layout.placement == "node-local" and layout.note is None
            check_invariants(layout, world, trainers, actors, buffers, coordinator, groups)
            for buffer_rank, served in layout.clients_of.items():
                assert all(hosts[c] == hosts[buffer_rank] for c in served)
            if buffers:
                per_host_count = Counter(hosts[b] for b in layout.buffers)
                assert set(per_host_count.values()) == {per_host}
                assert set(per_host_count) == set(host_names)


def test_fallback_matches_block_placement() -> None:
    hosts = ["a", "a", "a", "b", "b", "b", "b", "b"]
    cfg = {"buffers": 3, "coordinator": True, "placement": "node-local"}
    fallback = plan_layout(8, cfg, hosts, fallback_to_block=True)
    block = plan_layout(8, {**cfg, "placement": "block"}, hosts)
    assert fallback.roles == block.roles and dict(fallback.buffer_of) == dict(block.buffer_of)
    assert "multiple of the number of hosts (2: a, b)" in fallback.note
    assert block.note is None


def test_worked_example_from_the_brief() -> None:
    layout = plan_layout(8, {"buffers": 3, "coordinator": False})
    assert dict(layout.clients_of) == {2: (0, 1), 5: (3, 4), 7: (6,)}
    assert layout.trainers == (0, 1, 3, 4, 6)


def test_node_local_interleaved_hosts_keep_clients_local() -> None:
    hosts = ["a", "b"] * 4
    layout = plan_layout(8, {"buffers": 2, "placement": "node-local"}, hosts)
    assert layout.coordinator == 7
    # host a: ranks 0,2,4,6 -> buffer 6; host b: ranks 1,3,5 (7 is the coordinator) -> buffer 5
    assert dict(layout.clients_of) == {6: (0, 2, 4), 5: (1, 3)}
    assert layout.trainers == (0, 2, 4, 1, 3)  # placement order: host by host
