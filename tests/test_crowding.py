"""Waits for peers on a machine whose cores the job's ranks outnumber (gflowdist.runtime.crowding)."""

from __future__ import annotations

import pytest

from gflowdist.comm.polling import CROWDED_MAX_SLEEP_S, CROWDED_SPIN_S, SPIN_S, peer_wait, set_crowded
from gflowdist.runtime.crowding import Crowding, crowding_of


def test_ranks_sharing_cores_are_crowded_and_ranks_bound_to_a_core_each_are_not():
    shared = [("m", {0, 1})] * 4
    assert crowding_of(shared, 2) == Crowding(ranks=4, cores=2) and crowding_of(shared, 2).crowded
    bound = [("m", {0}), ("m", {1})]
    assert crowding_of(bound, 0) == Crowding(ranks=2, cores=2) and not crowding_of(bound, 0).crowded
    two_on_one_core = [("m", {0}), ("m", {0}), ("m", {1})]
    assert crowding_of(two_on_one_core, 1).crowded  # 3 ranks, the union of their CPUs is 2 cores


def test_only_the_ranks_of_my_machine_count():
    entries = [("a", {0, 1}), ("a", {0, 1}), ("b", {0, 1}), ("b", {0, 1}), ("b", {0, 1})]
    assert crowding_of(entries, 0) == Crowding(ranks=2, cores=2)
    assert crowding_of(entries, 4) == Crowding(ranks=3, cores=2)


def test_a_crowded_wait_spins_shorter_and_sleeps_in_shorter_steps(restore_waits):
    set_crowded(False)
    roomy = peer_wait(1_000_000)
    assert roomy.spin_s == pytest.approx(SPIN_S + 1e-3)
    set_crowded(True)
    crowded = peer_wait(1_000_000)
    assert crowded.spin_s == pytest.approx(CROWDED_SPIN_S + 1e-3) and crowded.max_sleep_s == CROWDED_MAX_SLEEP_S
    assert crowded.spin_s < roomy.spin_s and crowded.max_sleep_s < roomy.max_sleep_s


def test_the_decision_is_described_in_the_ranks_log_terms():
    assert "short spins" in Crowding(ranks=5, cores=2).describe()
    assert "spin 2 ms" in Crowding(ranks=2, cores=2).describe()
