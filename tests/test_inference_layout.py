"""layout.inference: where inference ranks go, whom each serves, whose weights it holds; the report's lines.

Pure computation (no ranks): the real-rank runs are in tests/test_inference_jobs.py.
"""

from __future__ import annotations

import pytest

from gflowdist.errors import LayoutError
from gflowdist.layout import Role, plan_layout
from gflowdist.timing.inference_lines import inference_lines, inference_stragglers
from gflowdist.timing.report import Report


def test_one_inference_rank_sits_before_the_coordinator_and_serves_every_actor():
    layout = plan_layout(6, {"trainers": 1, "actors": 2, "buffers": 1, "inference": 1, "coordinator": True})
    assert layout.roles[4] is Role.INFERENCE and layout.coordinator == 5
    assert layout.ranks_of(Role.INFERENCE) == layout.inference == (4,)
    assert dict(layout.inference_of) == {1: 4, 2: 4} and dict(layout.served_by) == {4: (1, 2)}
    assert layout.trainer_of[4] == 0
    trainer, actor, server = layout.for_rank(0), layout.for_rank(1), layout.for_rank(4)
    assert trainer.inference_ranks == (4,) and trainer.actors == (1, 2)  # stop and checkpoints still go to actors
    assert actor.inference == 4 and actor.trainer == 0 and actor.buffer == 3
    assert server.served == (1, 2) and server.trainer == 0 and server.buffer is None
    assert "1 inference rank" in layout.summary()
    rows = layout.describe().splitlines()
    assert rows[3].split()[1:] == ["actor", "-", "3", "0", "trainer", "0,", "inference", "4"]
    assert rows[6].split()[1:] == ["inference", "-", "-", "0", "trainer", "0,", "actors", "1,2"]
    assert layout.to_dict()["served_by"] == {4: [1, 2]}


def test_each_trainer_with_actors_gets_its_own_inference_ranks():
    layout = plan_layout(10, {"trainers": 2, "actors": 5, "buffers": 1, "inference": 2, "coordinator": False})
    assert layout.inference == (8, 9)
    assert dict(layout.served_by) == {8: layout.actors_of[0], 9: layout.actors_of[1]}
    assert all(layout.trainer_of[a] == layout.trainer_of[layout.inference_of[a]] for a in layout.actors)
    three = plan_layout(10, {"trainers": 1, "actors": 5, "buffers": 1, "inference": 3, "coordinator": False})
    assert [len(three.served_by[r]) for r in three.inference] == [2, 2, 1]  # consecutive runs, split evenly


def test_no_inference_ranks_leaves_the_layout_as_it_was():
    layout = plan_layout(5, {"trainers": 1, "actors": 2, "buffers": 1, "coordinator": True})
    assert layout.inference == () and not layout.inference_of and layout.for_rank(1).inference is None


@pytest.mark.parametrize(
    "world, layout, words",
    [
        (6, {"trainers": 2, "actors": 2, "buffers": 1, "inference": 1, "coordinator": False}, "2 trainers have actors"),
        (5, {"trainers": 1, "actors": 1, "buffers": 1, "inference": 2, "coordinator": False}, "has 1 actor"),
        (5, {"trainers": 1, "actors": 2, "buffers": 1, "inference": 1, "coordinator": True}, "1 inference rank"),
    ],
)
def test_impossible_inference_layouts_say_why(world, layout, words):
    with pytest.raises(LayoutError, match=words):
        plan_layout(world, layout)


def test_rest_counts_leave_room_for_the_inference_ranks():
    layout = plan_layout(8, {"trainers": 1, "actors": "rest", "buffers": 1, "inference": 2, "coordinator": True})
    assert len(layout.actors) == 3 and layout.inference == (5, 6)


def test_node_local_placement_is_refused_with_inference_ranks():
    with pytest.raises(LayoutError, match="block placement only"):
        plan_layout(
            6,
            {"trainers": 1, "actors": 2, "buffers": 1, "inference": 1, "coordinator": True, "placement": "node-local"},
            hosts=["a"] * 6,
        )


STATS = {
    "max_batch": 64,
    "max_delay_ms": 2.0,
    "batches": 10,
    "requests": 20,
    "observations": 80,
    "refused": 0,
    "mean_batch": 8.0,
    "mean_requests_per_batch": 2.0,
    "sizes": {"8": 9, "4": 1},
    "closed_by": {"all waiting": 9, "delay": 1},
    "delay_mean_ms": 0.5,
    "delay_p50_ms": 0.1,
    "delay_p95_ms": 1.9,
    "delay_max_ms": 2.5,
    "forward_mean_ms": 0.4,
}


def test_the_report_shows_batch_sizes_and_queueing_delay():
    lines = inference_lines({4: STATS}, {4: "vm"})
    assert lines[1].startswith("  rank 4 on vm: 10 batches of 20 requests, 80 observations; batch mean 8.0")
    assert "most common batch sizes: 8 x9, 4 x1; ran because: all waiting 9, delay 1" in lines[2]
    assert "queueing delay ms: mean 0.50, p50 0.10, p95 1.90, max 2.50 (max_delay_ms 2)" in lines[3]


def test_an_inference_rank_that_keeps_its_actors_waiting_is_a_straggler():
    assert inference_stragglers({4: STATS}, {4: "vm"}) == []
    slow = {**STATS, "delay_mean_ms": 7.5, "forward_mean_ms": 6.0}
    (line,) = inference_stragglers({4: slow}, {4: "vm"})
    assert line.startswith("  inference/queue: rank 4 on vm kept its actors waiting: requests queued a mean 7.50 ms")
    assert "(inference.max_delay_ms 2)" in line


def test_the_report_keeps_the_inference_section_through_json(tmp_path):
    from gflowdist.timing import build_report

    report = build_report({}, roles={4: "inference"}, hosts={4: "vm"})
    import dataclasses

    report = dataclasses.replace(report, inference={4: {**STATS, "delay_mean_ms": 9.0}})
    again = Report.from_json(report.to_json())
    assert again.inference == {4: {**STATS, "delay_mean_ms": 9.0}}
    text = again.to_text()
    assert "Inference (actors' policy run centrally" in text
    assert "inference/queue: rank 4 on vm kept its actors waiting" in text
