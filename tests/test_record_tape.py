"""The record/replay tape on a local world: what is written, what a replay forces, how a divergence is named."""

from __future__ import annotations

import time

import pytest
import torch

from gflowdist.comm.local import LocalComm
from gflowdist.errors import GflowdistError, ReplayDivergence
from gflowdist.runtime.replaying import ReplayTape
from gflowdist.runtime.tape import FREE, RecordingTape, Site, batch_digest, read_recording
from gflowdist.transport import MessageType
from gflowdist.transport.channel import Channel


def _channel() -> Channel:
    return Channel(LocalComm(), tag=1)


def _replay(events, role="buffer") -> ReplayTape:
    return ReplayTape(events, rank=0, role=role, host="h", deadline_s=0.2)


def test_recording_holds_each_choice_and_not_what_is_no_choice(tmp_path) -> None:
    ch = _channel()
    tape = RecordingTape(tmp_path / "r.msgpack", {"rank": 0})
    assert tape.take(Site.DATA, ch, 0) is None  # a poll that found nothing is not written
    ch.isend(MessageType.HEARTBEAT, {}, 0)
    ch.isend(MessageType.METRICS, {"step": 1}, 0)
    heartbeat = tape.take(Site.CONTROL, ch, 3, transparent=lambda m: m.type is MessageType.HEARTBEAT)
    metrics = tape.take(Site.CONTROL, ch, 3, transparent=lambda m: m.type is MessageType.HEARTBEAT)
    assert heartbeat.type is MessageType.HEARTBEAT and metrics.type is MessageType.METRICS
    assert tape.stop(4, False, "") == (False, "") and tape.stop(5, True, "signal SIGINT") == (True, "signal SIGINT")
    assert tape.decide(Site.SUMMARY, 7, True) and not tape.decide(Site.SUMMARY, 8, False)
    tape.check(Site.LOSS, 5, 0.25)
    tape.close()
    header, events, complete = read_recording(tmp_path / "r.msgpack")
    assert header["rank"] == 0 and complete
    assert all(0 <= e[-1] < 60_000 for e in events)  # each event's milliseconds since the tape opened
    assert [e[:-1] for e in events] == [
        [Site.CONTROL, 3, 0, int(MessageType.METRICS), -1],
        [Site.STOP, 5, "signal SIGINT"],
        [Site.SUMMARY, 7],
        [Site.LOSS, 5, 0.25],
    ]


def test_replay_takes_only_what_was_recorded_where_it_was_recorded() -> None:
    ch = _channel()
    ch.isend(MessageType.TRAJECTORIES, {"n": 1}, 0)  # seq 0
    tape = _replay(
        [[Site.SUMMARY, 0, 100], [Site.DATA, 0, 0, int(MessageType.TRAJECTORIES), 0, 200], [Site.STOP, 2, "why", 300]]
    )
    assert tape.take(Site.DATA, ch, 0) is None  # the summary comes first: this poll finds nothing
    assert tape.decide(Site.SUMMARY, 0, False)
    assert tape.take(Site.DATA, ch, 0).body == {"n": 1}
    assert tape.stop(1, False, "") == (False, "")
    assert tape.stop(2, False, "") == (True, "why")
    tape.finish()


def test_a_choice_about_one_of_several_ranks_replays_for_that_rank_only(tmp_path) -> None:
    """WEIGHTS: at one step a trainer decides per actor; only the actor recorded as skipped is skipped."""
    tape = RecordingTape(tmp_path / "r.msgpack", {"rank": 0})
    made = [tape.decide(Site.WEIGHTS, 4, skip, who=actor) for actor, skip in ((2, False), (3, True), (4, True))]
    assert made == [False, True, True]
    tape.close()
    _, events, _ = read_recording(tmp_path / "r.msgpack")
    assert [e[:-1] for e in events] == [[Site.WEIGHTS, 4, 3], [Site.WEIGHTS, 4, 4]]
    replay = _replay(events, role="trainer")  # the clock now says the opposite of what was recorded
    assert [replay.decide(Site.WEIGHTS, 4, not skip, who=a) for a, skip in ((2, False), (3, True), (4, True))] == [
        False,
        True,
        True,
    ]
    replay.finish()


def test_replay_names_a_different_message_a_missing_one_and_a_different_loss() -> None:
    ch = _channel()
    ch.isend(MessageType.SAMPLE_REQUEST, {"n": 1}, 0)
    tape = _replay([[Site.DATA, 5, 0, int(MessageType.TRAJECTORIES), 0, 1000]])
    with pytest.raises(
        ReplayDivergence,
        match=r"rank 0 \(buffer on h\) at message 5: expected DATA: "
        r"TRAJECTORIES seq 0 from rank 0 at 5, got SAMPLE_REQUEST",
    ):
        tape.take(Site.DATA, ch, 5)
    waiting = _replay([[Site.INBOX, 3, 0, int(MessageType.WEIGHTS), 0, 10]], role="actor")
    with pytest.raises(
        ReplayDivergence,
        match=r"at iteration 3: waited \d+\.\d s for INBOX: WEIGHTS seq 0 from rank 0 "
        r"at 3 \(the recorded run took 0.0 s to it\)",
    ):
        waiting.take(Site.INBOX, _channel(), 3, wait=True)
    patient = _replay([[Site.DATA, 1, 0, int(MessageType.TRAJECTORIES), 0, 5000]])
    time.sleep(0.3)  # past deadline_s, but the recorded run took 5 s to this message: a replay waits up to 50 s
    assert patient.take(Site.DATA, _channel(), 1) is None
    loss = _replay([[Site.LOSS, 2, 0.5, 3000]], role="trainer")
    with pytest.raises(ReplayDivergence, match=r"at step 2: LOSS check: the loss is 0.75, the recording's 0.5"):
        loss.check(Site.LOSS, 2, 0.75)
    left = _replay([[Site.STOP, 9, "x", 3000]], role="trainer")
    with pytest.raises(ReplayDivergence, match="ended with 1 recorded events not replayed"):
        left.finish()


def test_batch_digest_sees_values_shapes_and_names() -> None:
    batch = {"x": torch.arange(6.0).reshape(2, 3), "y": torch.tensor([1, 2])}
    assert batch_digest(batch) == batch_digest({k: v.clone() for k, v in batch.items()})
    assert batch_digest(batch) != batch_digest({**batch, "x": batch["x"].reshape(3, 2)})
    changed = batch["x"].clone()
    changed[1, 2] = torch.nextafter(changed[1, 2], torch.tensor(10.0))  # one bit
    assert batch_digest(batch) != batch_digest({**batch, "x": changed})


def test_a_damaged_recording_is_named(tmp_path) -> None:
    path = tmp_path / "rank-0.msgpack"
    path.write_bytes(b"\x93\x01")
    with pytest.raises(GflowdistError, match="not a gflowdist recording"):
        read_recording(path)
    assert FREE == -1
