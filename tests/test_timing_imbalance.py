"""Load-imbalance numbers on constructed inputs, the wait matrix, torchgfn-style reports."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gflowdist.errors import GflowdistError
from gflowdist.timing import (
    StepTimer,
    phase_imbalance,
    report_load_imbalance,
    report_time_info,
    wait_matrix,
)


def test_one_iteration_times_1_2_3() -> None:
    row = phase_imbalance("rollout", {0: [1.0], 1: [2.0], 2: [3.0]})
    assert row.useful == 2.0  # mean(1, 2, 3)
    assert row.waiting == 1.0  # max 3 - mean 2
    assert row.waiting_pct == pytest.approx(100.0 / 3.0)
    assert row.straggler == 2 and row.straggler_iterations == 1
    assert row.busy == {0: 1.0, 1: 2.0, 2: 3.0}
    assert row.idle == {0: 2.0, 1: 1.0, 2: 0.0}


def test_several_iterations_sum_per_iteration_terms() -> None:
    # iteration 0: (1, 3) mean 2 max 3; iteration 1: (4, 2) mean 3 max 4; iteration 2: (5, 1)
    row = phase_imbalance("p", {0: [1.0, 4.0, 5.0], 1: [3.0, 2.0, 1.0]})
    assert row.useful == 2.0 + 3.0 + 3.0
    assert row.waiting == 1.0 + 1.0 + 2.0
    assert row.straggler == 0 and row.straggler_iterations == 2 and row.contested_iterations == 3


def test_equal_times_name_no_straggler() -> None:
    row = phase_imbalance("p", {0: [0.1, 0.1], 1: [0.1, 0.1], 2: [0.1, 0.1]})
    assert row.waiting == pytest.approx(0.0, abs=1e-15) and row.waiting >= 0.0
    assert row.straggler is None and row.contested_iterations == 0
    assert row.waiting_pct == pytest.approx(0.0, abs=1e-12)


def test_straggler_is_the_most_often_slowest_with_ties_to_the_lower_rank() -> None:
    row = phase_imbalance("p", {0: [2.0, 1.0, 1.0], 1: [1.0, 2.0, 1.0], 2: [1.0, 1.0, 2.0], 3: [1.0, 1.0, 1.0]})
    assert (row.straggler, row.straggler_iterations) == (0, 1)
    row = phase_imbalance("p", {0: [2.0, 1.0, 1.0], 1: [1.0, 2.0, 2.0]})
    assert (row.straggler, row.straggler_iterations) == (1, 2)


def test_uneven_iteration_counts_average_over_ranks_that_reached_i() -> None:
    # iteration 0: (1, 3) -> mean 2, waiting 1; iterations 1, 2: rank 0 alone -> mean 1, waiting 0
    row = phase_imbalance("p", {0: [1.0, 1.0, 1.0], 1: [3.0]})
    assert (row.iterations, row.min_iterations, row.uneven) == (3, 1, True)
    assert row.useful == 2.0 + 1.0 + 1.0
    assert row.waiting == 1.0
    assert row.straggler == 1 and row.contested_iterations == 1
    assert row.idle == {0: 2.0, 1: 0.0}
    assert any("uneven" in note for note in row.notes())


def test_missing_ranks_are_listed_not_skipped() -> None:
    row = phase_imbalance("eval", {0: [1.0], 2: [3.0]}, group=[0, 1, 2])
    assert row.ranks == (0, 2) and row.missing_ranks == (1,)
    assert (row.useful, row.waiting) == (2.0, 1.0)
    assert any("not recorded on ranks 1" in note for note in row.notes())


def test_phase_with_no_iterations() -> None:
    row = phase_imbalance("p", {0: [], 1: []})
    assert (row.iterations, row.useful, row.waiting, row.straggler) == (0, 0.0, 0.0, None)
    assert row.waiting_pct == 0.0


times_strategy = st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda n: st.lists(
            st.lists(st.floats(0.0, 100.0, allow_nan=False), min_size=n, max_size=n), min_size=1, max_size=5
        )
    )
)
def test_identities_with_equal_counts(rows: list[list[float]]) -> None:
    """useful + waiting = sum_i max_i; useful = mean of totals; waiting = mean of idle."""
    times = dict(enumerate(rows))
    row = phase_imbalance("p", times)
    n_iter = len(rows[0])
    sum_of_max = sum(max(r[i] for r in rows) for i in range(n_iter))
    assert row.useful + row.waiting == pytest.approx(sum_of_max, abs=1e-9)
    assert row.useful == pytest.approx(sum(sum(r) for r in rows) / len(rows), abs=1e-9)
    assert row.waiting == pytest.approx(sum(row.idle.values()) / len(rows), abs=1e-9)
    assert 0.0 <= row.waiting_pct <= 100.0


@settings(max_examples=60, deadline=None)
@given(st.lists(times_strategy, min_size=1, max_size=5))
def test_uneven_counts_match_a_direct_loop(rows: list[list[float]]) -> None:
    row = phase_imbalance("p", dict(enumerate(rows)))
    useful = waiting = 0.0
    for i in range(max(map(len, rows))):
        present = [r[i] for r in rows if len(r) > i]
        mean = sum(present) / len(present)
        useful += mean
        waiting += max(max(present) - mean, 0.0)
    assert row.useful == pytest.approx(useful, abs=1e-9)
    assert row.waiting == pytest.approx(waiting, abs=1e-9)


def _waiting_timer(waits: list[tuple[int, str, float]]) -> StepTimer:
    timer = StepTimer()
    for peer, label, seconds in waits:
        timer.record_wait(peer, label, seconds)
    return timer


def test_wait_matrix_cells_and_sums() -> None:
    timers = {
        0: _waiting_timer([(3, "sample", 1.0), (3, "weights", 0.5), (1, "allreduce", 0.25)]),
        1: _waiting_timer([(3, "sample", 2.0)]),
        3: _waiting_timer([(0, "recv", 4.0)]),
        2: StepTimer(),
    }
    m = wait_matrix(timers)
    assert m.ranks == (0, 1, 3)  # rank 2 neither waited nor was waited on
    assert m.matrix() == [[0.0, 0.25, 1.5], [0.0, 0.0, 2.0], [4.0, 0.0, 0.0]]
    assert m.waited(0) == 1.75 and m.waited_on(3) == 3.5
    assert m.total() == 1.0 + 0.5 + 0.25 + 2.0 + 4.0
    assert sum(map(sum, m.matrix())) == m.total()
    assert m.top_pairs(2) == [(3, 0, 4.0), (1, 3, 2.0)]
    assert m.counts[0][3] == {"sample": 1, "weights": 1}


def test_report_load_imbalance_returns_and_logs_table(caplog: pytest.LogCaptureFixture) -> None:
    timing = [
        {"step_a": [1.0, 2.0, 3.0], "step_b": [0.5, 0.5, 0.5]},
        {"step_a": [1.5, 2.5, 3.5], "step_b": [0.5, 0.5, 0.5]},
    ]
    with caplog.at_level(logging.INFO, logger="gflowdist.timing.torchgfn_reports"):
        result = report_load_imbalance(timing, 2)
    a = result.phase("step_a")
    # each iteration: mean = t0 + 0.25, waiting = 0.25
    assert a.useful == pytest.approx(1.25 + 2.25 + 3.25)
    assert a.waiting == pytest.approx(0.75)
    assert result.phase("step_b").waiting == 0.0
    assert "Step Name" in result.text and "Useful Work" in result.text
    assert "    6.7500s" in result.text and "0.7500s" in result.text
    assert str(result) == result.text
    assert "step_a" in caplog.text and "6.7500s" in caplog.text


def test_report_load_imbalance_handles_missing_steps_and_uneven_counts(caplog: pytest.LogCaptureFixture) -> None:
    timing = {0: {"a": [1.0, 1.0], "only0": 2.0}, 1: {"a": [3.0]}, "2": {"a": [2.0], "only2": [1]}}
    with caplog.at_level(logging.WARNING, logger="gflowdist.timing.torchgfn_reports"):
        result = report_load_imbalance(timing, 3)
    assert [p.phase for p in result.phases] == ["a", "only0", "only2"]
    a = result.phase("a")
    assert (a.useful, a.waiting) == (2.0 + 1.0, 1.0)
    assert result.phase("only0").missing_ranks == (1, 2)
    assert len(result.notes) == 3 and "note: " in result.text
    assert "not recorded" in caplog.text


def test_report_load_imbalance_validates_inputs() -> None:
    with pytest.raises(GflowdistError, match="no timing dict for ranks 2"):
        report_load_imbalance([{"a": [1.0]}, {"a": [1.0]}], 3)
    with pytest.raises(GflowdistError, match="world_size"):
        report_load_imbalance([{"a": [1.0]}], 0)
    with pytest.raises(GflowdistError, match="rank 0"):
        report_load_imbalance([["a"]], 1)  # type: ignore[list-item]


def test_report_time_info_numbers_and_text() -> None:
    timing = [{"a": [1.0, 3.0], "b": []}, {"a": [5.0]}, {"c": 2.0}]
    info = report_time_info(timing, 3)
    assert info.per_rank[0]["a"].mean == 2.0 and info.per_rank[0]["a"].total == 4.0
    assert info.per_rank[0]["b"].mean is None
    assert info.maximum["a"] == (5.0, 1)
    assert info.average["a"] == (4.0 + 5.0) / 2  # over the ranks that recorded "a"
    assert info.average["c"] == 2.0
    assert "  a: 2.0000 seconds (total: 4.0000 seconds)" in info.text
    assert "  b: no iterations (total: 0.0000 seconds)" in info.text
    assert "Maximum timing information:" in info.text
    assert "  a: 5.0000 seconds (rank 1)" in info.text
    assert "  a: 4.5000 seconds" in info.text.split("Average timing information:")[1]
