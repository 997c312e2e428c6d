"""A role's batch checked where it is made, in the user's terms (issue 23 item 2), and a fresh batch its buffer
would refuse refused before it is concatenated with the replayed one (issue 26), in one process."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from gflowdist.errors import BadBatchError, BatchError
from gflowdist.runtime.liveness import Refusals
from gflowdist.runtime.loops.batches import check_batch, refusal_before_concat, role_method
from gflowdist.runtime.loops.trainer import fresh_refusal


class HyperGridTrainer:  # only its name matters: messages name the user's class
    pass


WHERE = role_method(HyperGridTrainer(), "rollout")


def good(n: int = 4) -> dict:
    return {
        "states": torch.zeros(n, 3, 2),
        "actions": torch.zeros(n, 3, dtype=torch.long),
        "log_rewards": torch.ones(n),
    }


def test_role_method_names_the_users_class():
    assert WHERE == "HyperGridTrainer.rollout"
    assert check_batch(good(), WHERE) == 4


@pytest.mark.parametrize(
    "batch,expected,key",
    [
        ([torch.zeros(4)], r"HyperGridTrainer.rollout returned a list: a batch is a dict of tensors", None),
        (torch.zeros(4, 2), r"HyperGridTrainer.rollout returned a torch.Tensor: a batch is a dict of tensors", None),
        ({}, r"HyperGridTrainer.rollout returned an empty dict", None),
        ({**good(), "extra": [1, 2, 3, 4]}, r"field 'extra' is a list, not a torch.Tensor \(torch.as_tensor", "extra"),
        (
            {**good(), "obs": np.zeros((4, 2))},
            r"field 'obs' is a numpy.ndarray, not a torch.Tensor \(torch.from_numpy",
            "obs",
        ),
        ({**good(), "log_z": torch.tensor(1.0)}, r"field 'log_z' is a 0-d tensor: every field needs one row", "log_z"),
        ({3: torch.zeros(4)}, r"with the key 3 \(int\): field names are strings", "3"),
        (
            {"states": torch.zeros(31, 2), "actions": torch.zeros(32), "log_rewards": torch.zeros(32)},
            r"returned fields with different numbers of rows: 'states' 31, 'actions' 32, 'log_rewards' 32",
            "states",
        ),
        (good(0), r"returned a batch of 0 trajectories \(every field has 0 rows\): return None", "states"),
    ],
)
def test_a_batch_that_is_no_batch_is_named_with_the_role_class_method_and_field(batch, expected, key):
    with pytest.raises(BatchError, match=expected) as caught:
        check_batch(batch, WHERE)
    assert str(caught.value).startswith("HyperGridTrainer.rollout returned ")
    assert caught.value.where == WHERE and caught.value.key == key


def test_nan_in_a_batch_is_refused_only_where_the_config_forbids_it():
    batch = good(8)
    batch["log_rewards"][[2, 5]] = float("nan")
    assert check_batch(batch, WHERE) == 8  # faults.on_nonfinite_batch: allow (the default) ships it
    with pytest.raises(BatchError, match=r"returned NaN in field 'log_rewards' \(rows 2, 5 of 8\) \(faults.on_nonf"):
        check_batch(batch, WHERE, nonfinite="fail")
    batch = good(8)
    batch["states"][7, 1, 0] = float("inf")
    with pytest.raises(BatchError, match=r"returned an infinite value in field 'states' \(row 7 of 8\)") as caught:
        check_batch(batch, WHERE, nonfinite="fail")
    assert caught.value.key == "states"
    assert check_batch({"actions": torch.zeros(2, dtype=torch.long)}, WHERE, nonfinite="fail") == 2  # ints: no scan


def test_a_fresh_batch_is_judged_against_the_replayed_one_in_the_buffers_words():
    replayed = good(2)
    assert refusal_before_concat(good(), replayed) is None
    assert refusal_before_concat(good(), None) is None
    grown = {**good(), "states": torch.zeros(4, 4, 2)}
    assert refusal_before_concat(grown, replayed) == (
        "field 'states': got per-item shape [4, 2] torch.float32, the storage holds [3, 2] torch.float32"
    )
    prioritized = {**replayed, "weights": torch.ones(2), "keys": torch.zeros(2, dtype=torch.long)}
    assert refusal_before_concat(good(), prioritized) is None  # a prioritized buffer's own fields are not stored
    missing = {k: v for k, v in good().items() if k != "actions"}
    assert "missing ['actions'], unexpected []" in refusal_before_concat(missing, replayed)


class _Trainer(HyperGridTrainer):
    device = "cpu"


def _refusals() -> Refusals:
    refusals = Refusals()
    refusals.shipped(40, 5, role_method(_Trainer(), "rollout"))  # what ship() recorded of the step's batch (seq 40-47)
    return refusals


def _refuse(fresh: dict, replayed: dict, mode: str, refusals: Refusals) -> int | None:
    """A trainer's check before its concat (:meth:`TrainerLoop.combine`): rank 1 (trainer), its buffer rank 2,
    48 trajectories produced (the fresh batch counted); the refused seq (drop), None (it fits); fail raises."""
    refused = fresh_refusal(fresh, replayed, 48, buffer="rank 2 (buffer on vm)", me="rank 1 (trainer on vm)")
    if refused is None:
        return None
    seq, text = refused
    refusals.refuse_mine(seq, text, mode)
    return seq


def test_a_shape_changing_batch_is_refused_before_the_concat_and_never_crashes_its_sender(caplog):
    """Before: torch's 'Sizes of tensors must match' from concat_batches, whatever faults.on_bad_batch said."""
    grown = {**good(8), "states": torch.zeros(8, 4, 2)}
    replayed = good(8)
    with pytest.raises(RuntimeError, match="Sizes of tensors must match"):  # what the concat alone does
        torch.cat([grown["states"], replayed["states"]])
    refusals = _refusals()
    with pytest.raises(BadBatchError) as caught:
        _refuse(grown, replayed, "fail", refusals)
    assert str(caught.value) == (
        "buffer rank 2 (buffer on vm) refused a batch of 8 trajectories (seq 40-47) from rank 1 (trainer on vm): "
        "field 'states': got per-item shape [4, 2] torch.float32, the storage holds [3, 2] torch.float32 "
        "(faults.on_bad_batch = fail; 'drop' would count it and go on); _Trainer.rollout made it at step 5"
    )
    assert caught.value.step == 5 and refusals.mine == {40}
    refusals = _refusals()
    with caplog.at_level(logging.WARNING, logger="gflowdist.runtime"):
        assert _refuse(grown, replayed, "drop", refusals) == 40  # the step learns from the replayed items alone
    assert (
        "_Trainer.rollout made it at step 5" in caplog.text and ": dropped (faults.on_bad_batch = drop)" in caplog.text
    )
    # the buffer's own refusal of the same batch, when it comes, is counted, not answered a second time
    assert not refusals.is_news(40) and refusals.heard == 1 and refusals.mine == set()
    assert _refuse(good(8), replayed, "fail", refusals) is None  # a batch that fits is concatenated as before


def test_a_refusal_reads_the_same_whether_the_trainer_or_its_buffer_saw_it_first():
    """The restart rule compares failures by their text. The buffer's refusal lacked the origin that the
    trainer's own check before its concat gives, so a job whose same failure came both ways was restarted
    once more than faults.max_restarts allows after a repeated failure (tests/test_keep_training.py, once in CI)."""
    grown = {**good(8), "states": torch.zeros(8, 4, 2)}
    with pytest.raises(BadBatchError) as mine:
        _refuse(grown, good(8), "fail", _refusals())
    heard = _refusals()  # a trainer that did not check first hears its buffer's words (Liveness.refused)
    buffers_words = str(mine.value).split(" (faults.on_bad_batch")[0]  # what the buffer sends: its refusal_text
    assert heard.is_news(40)
    with pytest.raises(BadBatchError) as theirs:
        heard.answer(40, buffers_words, "fail")
    assert str(theirs.value) == str(mine.value) and theirs.value.step == mine.value.step == 5
    assert str(mine.value).endswith("; _Trainer.rollout made it at step 5")
