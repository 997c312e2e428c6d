"""gflowdist.compat.torchgfn.RankLayout against torchgfn's own (its newest distributed.py), case by case.

The original is torchgfn's unreleased ``gfn/utils/distributed.py`` kept in
tests/originals/torchgfn (tests/support/originals.py). Every layout both
build for 1 to 12 ranks, 0-3 buffers, 1-3 agent groups, 0-1 coordinators and
one to three hosts must agree in every attribute, every per-rank answer and
the summary; where torchgfn asserts, gflowdist raises ``LayoutError``
(documented in docs/migration-torchgfn.md).
"""

from __future__ import annotations

import itertools
from functools import partial

import pytest

from gflowdist.compat.torchgfn import RankLayout
from gflowdist.compat.torchgfn_layout import as_layout
from gflowdist.errors import LayoutError
from gflowdist.layout import Role
from tests.support.originals import load_file, torchgfn_newest_distributed


@pytest.fixture(scope="module")
def original():
    return load_file(torchgfn_newest_distributed(), "torchgfn_distributed_newest").RankLayout


def host_lists(world: int) -> list[list[str]]:
    half = world // 2
    lists = [["a"] * world, ["a"] * half + ["b"] * (world - half), ["a", "b"] * half + ["a"] * (world % 2)]
    if world >= 3:
        lists.append(["a"] * (world - 2) + ["b", "c"])
    return lists


def facts(layout, world: int, nodes: int) -> tuple:
    per_rank = [
        (layout.assigned_buffer(r), layout.assigned_training_ranks(r), layout.agent_group_id(r)) for r in range(world)
    ]
    return (
        layout.training_ranks,
        layout.buffer_ranks,
        layout.agent_ranks_per_group,
        layout.num_training_ranks,
        layout.agent_group_size,
        layout.buffer_rank_set,
        layout.agent_group_rank_list,
        per_rank,
        layout.summary(nodes),
    )


def outcome(make, world: int, nodes: int):
    try:
        return "ok", facts(make(), world, nodes)
    except (AssertionError, ZeroDivisionError):  # torchgfn's checks; from_hostnames without buffers
        return "refused", None
    except LayoutError:  # the same checks here (a ValueError that python -O keeps)
        return "refused", None
    except ValueError as err:  # from_hostnames: a host too small, in both
        return "ValueError", str(err)


CASES = [
    (world, buffers, groups, coordinators)
    for world, buffers, groups, coordinators in itertools.product(range(1, 13), range(4), range(1, 4), range(2))
]


def test_build_and_from_hostnames_match_torchgfn(original):
    compared = refused = 0
    for world, buffers, groups, coordinators in CASES:
        for nodes in (1, 2, 3):
            args = (world, buffers, nodes, groups, coordinators)
            theirs = outcome(partial(original.build, *args), world, nodes)
            ours = outcome(partial(RankLayout.build, *args), world, nodes)
            assert ours == theirs, f"build({world}, {buffers}, {nodes}, {groups}, {coordinators})"
            compared += theirs[0] == "ok"
            refused += theirs[0] != "ok"
        for hosts in host_lists(world):
            nodes = len(set(hosts))
            args = (world, buffers, groups, coordinators, hosts)
            theirs = outcome(partial(original.from_hostnames, *args), world, nodes)
            ours = outcome(partial(RankLayout.from_hostnames, *args), world, nodes)
            assert ours == theirs, f"from_hostnames({world}, {buffers}, {groups}, {coordinators}, {hosts})"
            compared += theirs[0] == "ok"
    assert compared > 500 and refused > 50  # both kinds of case were exercised


def test_summary_and_queries_example():
    layout = RankLayout.build(8, 3, 1, 1, 0)  # torchgfn's docstring example: 0,1 -> 2; 3,4 -> 5; 6 -> 7
    assert layout.buffer_ranks == [2, 5, 7] and layout.training_ranks == [0, 1, 3, 4, 6]
    assert layout.assigned_buffer(4) == 5 and layout.assigned_training_ranks(7) == [6]
    assert layout.summary(1).splitlines()[1] == "  Group 0: Training ranks [0, 1]. Buffer manager rank 2."


def test_impossible_layouts_raise_layout_error_not_assert():
    with pytest.raises(LayoutError, match="Not enough ranks"):
        RankLayout.build(2, 1, 1, 1, 1)
    with pytest.raises(LayoutError, match="divisible by num_agent_groups"):
        RankLayout.build(5, 1, 1, 3, 0)


@pytest.mark.parametrize("make", ["ours", "theirs"])
def test_as_layout_from_either_rank_layout(make, original):
    cls = RankLayout if make == "ours" else original
    rank_layout = cls.from_hostnames(9, 2, 2, 1, ["a"] * 4 + ["b"] * 5)
    layout = as_layout(rank_layout, 9)
    assert list(layout.trainers) == rank_layout.training_ranks and list(layout.buffers) == rank_layout.buffer_ranks
    assert layout.coordinator == 8 and layout.role_of(8) is Role.COORDINATOR
    for rank in rank_layout.training_ranks:
        assert layout.buffer_of[rank] == rank_layout.assigned_buffer(rank)
        assert layout.group_of[rank] == rank_layout.agent_group_id(rank)
    for rank in rank_layout.buffer_ranks:
        assert list(layout.clients_of[rank]) == rank_layout.assigned_training_ranks(rank)


def test_as_layout_refuses_what_is_not_a_layout():
    with pytest.raises(TypeError, match=r"RankLayout or a gflowdist\.layout\.Layout, not dict"):
        as_layout({"training_ranks": [0]}, 2)
    with pytest.raises(LayoutError, match="without a role"):
        as_layout(RankLayout.build(4, 1, 1, 1, 0), 6)
    with pytest.raises(LayoutError, match="is for 4 ranks"):
        as_layout(as_layout(RankLayout.build(4, 1, 1, 1, 0), 4), 5)
