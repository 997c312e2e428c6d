"""Impossible layouts and the explanation each gives; host lists; Layout's readers and output."""

from __future__ import annotations

import json

import pytest

from gflowdist.config import LayoutConfig
from gflowdist.errors import LayoutError
from gflowdist.layout import Role, parse_host_list, plan_layout

IMPOSSIBLE = [
    # (world size, layout, hosts, words the message must contain)
    (
        4,
        {"trainers": 3, "buffers": 2},
        None,
        ["layout needs 3 trainers + 2 buffers + 1 coordinator = 6 ranks but the job has 4"],
    ),
    (
        8,
        {"trainers": 2, "buffers": 1},
        None,
        ["accounts for 2 trainers + 1 buffer + 1 coordinator = 4 ranks but the job has 8", "'rest'"],
    ),
    (4, {"buffers": 3}, None, ["no rank is left for the 'rest' trainers", "4 ranks - 3 buffers - 1 coordinator = 0"]),
    (
        2,
        {"trainers": 2, "buffers": "rest"},
        None,
        ["2 trainers + 1 coordinator = 3 ranks before the 'rest' buffers, but the job has 2"],
    ),
    (4, {"trainers": 0, "buffers": "rest", "coordinator": False}, None, ["0 trainers", "at least one trainer"]),
    (8, {"agent_groups": 4}, None, ["6 trainers cannot be split into 4 equal agent groups", "not a multiple of 4"]),
    (
        3,
        {"agent_groups": 2, "buffers": 0, "coordinator": False},
        None,
        ["3 trainers cannot be split into 2 equal agent groups"],
    ),
    (
        4,
        {"trainers": 1, "buffers": 3, "coordinator": False},
        None,
        ["3 buffers but only 1 trainer + 0 actors = 1 client", "at least one client"],
    ),
    (4, {"actors": 1, "buffers": 0}, None, ["1 actor but no buffer"]),
    (4, {"trainers": "rest", "actors": "rest"}, None, ["at most one count may be 'rest'"]),
    (4, {"buffers": -1}, None, ["invalid layout", "layout.buffers", "int -1"]),
    (4, {"bufers": 1}, None, ["unknown key 'bufers'", "did you mean 'buffers'"]),
    (0, {}, None, ["world size must be an integer >= 1, found 0"]),
    (-3, {}, None, ["world size must be an integer >= 1, found -3"]),
    (True, {}, None, ["world size must be an integer >= 1, found True"]),
    (1, {}, None, ["1 buffer + 1 coordinator = 2 ranks before the 'rest' trainers, but the job has 1"]),
    (4, {}, ["a", "b"], ["hosts lists 2 names but the job has 4 ranks"]),
    (2, {"buffers": 0}, ["a", ""], ["host name of rank 1 must be a non-empty string"]),
    (4, {}, "abcd", ["one host name per rank, found a string"]),
    (8, {"buffers": 2, "placement": "node-local"}, None, ["needs the host name of every rank"]),
    (
        8,
        {"buffers": 3, "placement": "node-local"},
        ["a"] * 4 + ["b"] * 4,
        ["number of buffers (3) to be a multiple of the number of hosts (2: a, b)"],
    ),
    (
        8,
        {"buffers": 2, "placement": "node-local"},
        ["a"] * 7 + ["b"],
        ["host 'b' has 0 ranks besides the coordinator", "at least 2"],
    ),
    (
        10,
        {"buffers": 2, "placement": "node-local", "coordinator": False},
        ["a"] * 7 + ["b"] * 3,
        ["unequal loads", "buffer 6 on 'a' would serve 6 clients but buffer 9 on 'b' 2", "differ by at most one"],
    ),
]


@pytest.mark.parametrize("world, layout_cfg, hosts, words", IMPOSSIBLE)
def test_impossible_layout_explains_itself(world, layout_cfg, hosts, words) -> None:
    with pytest.raises(LayoutError) as info:
        plan_layout(world, layout_cfg, hosts)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


def test_table_has_at_least_twenty_rows() -> None:
    assert len(IMPOSSIBLE) >= 20


def test_layout_config_instance_is_accepted() -> None:
    layout = plan_layout(4, LayoutConfig(buffers=1, coordinator=True))
    assert layout.trainers == (0, 1) and layout.buffers == (2,) and layout.coordinator == 3


def test_wrong_config_type() -> None:
    with pytest.raises(LayoutError, match="expected a LayoutConfig or a mapping, found int"):
        plan_layout(4, 3)  # type: ignore[arg-type]


def test_fallback_does_not_hide_count_errors() -> None:
    with pytest.raises(LayoutError, match="layout needs"):
        plan_layout(2, {"trainers": 3, "placement": "node-local"}, ["a", "b"], fallback_to_block=True)


def test_fallback_without_hosts_says_so() -> None:
    layout = plan_layout(8, {"buffers": 2, "placement": "node-local"}, fallback_to_block=True)
    assert layout.placement == "block"
    assert "needs the host name of every rank" in layout.note
    assert "note: " in layout.describe()


# --- host lists --------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, hosts",
    [
        ("a,b,a,b", ("a", "b", "a", "b")),
        ("a:2,b:2", ("a", "a", "b", "b")),
        ("a:2, b", ("a", "a", "b")),
        ("node-1:3", ("node-1",) * 3),
    ],
)
def test_parse_host_list(spec: str, hosts: tuple[str, ...]) -> None:
    assert parse_host_list(spec) == hosts


@pytest.mark.parametrize(
    "spec, words",
    [
        ("a,,b", "empty host name"),
        ("a:0", "positive integer, found '0'"),
        ("a:x", "positive integer, found 'x'"),
        (":2", "empty host name"),
    ],
)
def test_bad_host_list(spec: str, words: str) -> None:
    with pytest.raises(LayoutError, match=words):
        parse_host_list(spec)


# --- reading a layout -----------------------------------------------------------


@pytest.fixture
def mixed():
    """13 ranks: T=6, A=4, B=2, coordinator, 2 agent groups."""
    return plan_layout(13, {"actors": 4, "buffers": 2, "agent_groups": 2}, hosts=["h0"] * 7 + ["h1"] * 6)


def test_readers(mixed) -> None:
    # K = 10 clients -> split(10, 2) = [5, 5]; trainers split(6, 2) = [3, 3]
    assert mixed.trainers == (0, 1, 2, 6, 7, 8)
    assert mixed.actors == (3, 4, 9, 10)
    assert mixed.buffers == (5, 11)
    assert mixed.coordinator == 12
    assert mixed.agent_groups == ((0, 1, 2), (6, 7, 8))
    assert mixed.pop_ranks == (0, 6)
    # actor j -> trainer floor(j * 6 / 4): 0, 1, 3, 4 -> ranks 0, 1, 6, 7
    assert dict(mixed.trainer_of) == {3: 0, 4: 1, 9: 6, 10: 7}
    assert mixed.role_of(5) is Role.BUFFER and mixed.host_of(12) == "h1"
    assert mixed.agent_group_of(9) == 1 and mixed.agent_group_of(5) is None
    assert mixed.ranks_of(Role.COORDINATOR) == (12,)
    view = mixed.for_rank(6)
    assert view.is_pop_rank and view.group_members == (6, 7, 8) and view.buffer == 11
    assert view.actors == (9,)
    assert not mixed.for_rank(7).is_pop_rank
    buffer_view = mixed.for_rank(11)
    assert buffer_view.clients == (6, 7, 8, 9, 10) and buffer_view.group is None
    with pytest.raises(LayoutError, match="rank 13 is outside the world of 13 ranks"):
        mixed.role_of(13)


def test_describe_has_one_row_per_rank(mixed) -> None:
    lines = mixed.describe().splitlines()
    assert lines[0].startswith("world of 13 ranks: 6 trainers, 4 actors, 2 buffers, coordinator 12")
    assert lines[1].split() == ["rank", "role", "host", "buffer", "group", "links"]
    rows = [line.split() for line in lines[2:]]
    assert [int(row[0]) for row in rows] == list(range(13))
    assert [row[1] for row in rows] == [role.value for role in mixed.roles]
    assert rows[5][-2:] == ["clients", "0,1,2,3,4"]
    assert rows[9][-2:] == ["trainer", "6"]


def test_to_dict_is_plain_data(mixed) -> None:
    data = mixed.to_dict()
    assert data["roles"][12] == "coordinator" and data["pop_ranks"] == [0, 6]
    assert data["clients_of"][5] == [0, 1, 2, 3, 4]
    json.dumps(data)  # JSON-ready (int keys become strings)


def test_world_of_one() -> None:
    layout = plan_layout(1, {"buffers": 0, "coordinator": False})
    assert layout.roles == (Role.TRAINER,) and layout.pop_ranks == (0,)
    assert layout.for_rank(0).buffer is None
