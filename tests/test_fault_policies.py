"""The fault policies in one process: a non-finite loss, a refused batch, when a restart may cure a failure."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gflowdist.cli.restarts import Ended, why_not_restart
from gflowdist.errors import BadBatchError, NonFiniteLossError
from gflowdist.runtime.faults import loss_is_usable, on_refused


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_fails_naming_rank_and_step_or_is_skipped(value):
    loss = torch.tensor(value)
    with pytest.raises(NonFiniteLossError, match=rf"rank 3: the loss is {value} at step 17 \(faults.on_nonfinite"):
        loss_is_usable(loss, mode="fail", rank=3, step=17)
    assert loss_is_usable(loss, mode="skip", rank=3, step=17) is False
    assert loss_is_usable(torch.tensor(0.5), mode="fail", rank=3, step=17) is True


def test_a_refused_batch_fails_its_sender_at_the_step_that_made_it_or_is_dropped():
    with pytest.raises(BadBatchError, match="field 'y'") as caught:
        on_refused("buffer rank 2 refused ... field 'y'", mode="fail", step=5)
    assert caught.value.step == 5
    on_refused("buffer rank 2 refused ... field 'y'", mode="drop", step=5)  # logged, no exception


def _failed(step: int, text: str) -> Ended:
    return Ended(1, f"gflowdist: rank 1 (trainer on vm) failed at step {step}: {text}\nTraceback ...")


def test_what_a_restart_may_cure(tmp_path):
    (tmp_path / "checkpoints" / "gen-0000-step-000000010").mkdir(parents=True)
    (tmp_path / "checkpoints" / "gen-0000-step-000000010" / "MANIFEST.json").write_text("{}")
    lost = Ended(3, "gflowdist: lost rank 1 (trainer on vm): no heartbeat for 4.0 s")
    assert why_not_restart(lost, None, tmp_path) is None
    assert why_not_restart(lost, lost, tmp_path) is None  # a lost rank twice may still be cured
    boom = _failed(12, "RuntimeError: boom")
    assert why_not_restart(boom, None, tmp_path) is None
    assert why_not_restart(boom, _failed(15, "RuntimeError: boom"), tmp_path) is None  # another step
    assert "the same exception at step 12" in why_not_restart(boom, _failed(12, "RuntimeError: boom"), tmp_path)
    assert "a config error" in why_not_restart(_failed(0, "ConfigError: roles.trainer: ..."), None, tmp_path)
    assert "stopped from outside" in why_not_restart(Ended(130, None, interrupted=True), None, tmp_path)
    assert "no complete checkpoint" in why_not_restart(lost, None, tmp_path / "elsewhere")


def test_a_nonzero_exit_explained_by_a_lost_actor_is_a_success(tmp_path):
    (tmp_path / "ledger.json").write_text(json.dumps({"balanced": True, "lost_ranks": {"2": "lost rank 2 (...)"}}))
    assert Ended(137).judged_by(tmp_path, since=0).code == 0
    assert Ended(137, "gflowdist: rank 0 (...) failed: X").judged_by(tmp_path, since=0).code == 137
    assert Ended(137).judged_by(tmp_path, since=float("inf")).code == 137  # an older run's ledger.json
    (tmp_path / "ledger.json").write_text(json.dumps({"balanced": True, "lost_ranks": {}}))
    assert Ended(137).judged_by(tmp_path, since=0).code == 137
