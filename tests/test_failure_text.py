"""A rank's failure in the user's terms (runtime/failures.py), in one process."""

from __future__ import annotations

from gflowdist.errors import BatchError
from gflowdist.runtime.failures import Failure, describe_failure
from gflowdist.runtime.loops.batches import check_batch


def _users_loss():
    raise RuntimeError("boom in loss")


def _calls(fn):
    return fn()


def test_the_users_frames_come_first_with_the_log_and_no_framework_traceback():
    try:
        _calls(_users_loss)
    except RuntimeError as err:
        failure = describe_failure(err, rank=1, role="trainer", host="vm", step=30, log_path="runs/x/logs/rank-1.log")
    lines = failure.text.splitlines()
    assert lines[0] == "gflowdist: rank 1 (trainer on vm) failed at step 30: RuntimeError: boom in loss"
    assert lines[1] == "  in your code (most recent call last):"
    assert lines[-3].endswith(", in _users_loss") and lines[-2] == '      raise RuntimeError("boom in loss")'
    assert lines[-1] == "  the whole traceback: runs/x/logs/rank-1.log"
    assert failure.frame == f"test_failure_text.py:{_users_loss.__code__.co_firstlineno + 1} in _users_loss"
    assert "Traceback (most recent call last)" in failure.detail and "Traceback" not in failure.text
    assert Failure.from_dict(failure.to_dict()) == failure  # what a failed message carries to the collector


def test_an_error_gflowdist_raised_about_the_users_batch_says_where_gflowdist_raised_it():
    try:
        check_batch([1, 2], "HyperGridTrainer.rollout")
    except BatchError as err:
        failure = describe_failure(err, rank=0, role="trainer", host="vm", step=0, log_path=None)
    text = failure.text
    assert text.startswith("gflowdist: rank 0 (trainer on vm) failed at step 0: BatchError: HyperGridTrainer.rollout")
    # this test's frame (the caller) is the user's; the gflowdist frame that raised is named after it
    assert "in your code (most recent call last):" in text and "raised by gflowdist: runtime/loops/batches.py:" in text


def test_a_failed_ranks_later_silence_is_not_told_as_a_second_failure():
    from gflowdist.cli.supervise import _without_consequences

    first = "gflowdist: rank 1 (trainer on vm) failed at step 0: EncodeError: over the limit"
    others = [
        "rank 0 (trainer on vm) failed at step 0: EncodeError: over the limit",
        "lost rank 0 (trainer on vm): no heartbeat for 6.0 s (faults.peer_timeout_s = 6)",
        "lost rank 2 (buffer on vm): no heartbeat for 6.0 s (faults.peer_timeout_s = 6)",
    ]
    assert _without_consequences(first, others) == [others[0], others[2]]
