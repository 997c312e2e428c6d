"""The runtime and ``faults.max_message_bytes``: refused sends end the job clearly; refusals are logged.

* A rank whose own message is over the limit (a trainer's trajectory batch,
  a rank's final report) fails at the send (the channel's ``EncodeError``)
  through the ordinary failure path: the job exits non-zero with a message
  naming the rank, the message type, the destination and the key to raise,
  not as a rank lost for lack of heartbeats.
* The collector logs the control messages it refuses (``ProtocolError``),
  the first ``LOG_FIRST_REFUSALS`` one by one, then every
  ``LOG_EVERY_REFUSAL``-th, then the totals per sender; it counts them in its
  ledger's ``malformed``.

The jobs are the toy job (tests/jobs/toy.yaml: trainers 0 and 1, buffer 2,
coordinator 3), on the ``local`` engine (ranks as threads of this process: the
limit is the channel's, whatever the engine). Message sizes are derived here
with the codec, not guessed.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import torch

from gflowdist.comm.local import LocalComm
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.runtime import protocol
from gflowdist.runtime.collector import LOG_EVERY_REFUSAL, LOG_FIRST_REFUSALS, Collector
from gflowdist.runtime.protocol import Tags
from gflowdist.runtime.wiring import StopFlag, Wiring
from gflowdist.transport import encode
from tests.jobs.toy_roles import make_batch
from tests.support.jobs import TOY

TRAINERS = (0, 1)
BUFFER = 2
#: a sequence number and version far above what a few-step toy run reaches (msgpack ints grow with value)
BIG = 1 << 20


def _trajectory_bytes(n: int) -> int:
    """Encoded size of a toy trainer's batch of ``n`` (built as the trainer builds it)."""
    batch = make_batch(n, torch.Generator().manual_seed(0))
    return int(encode(*protocol.trajectories(batch, seq=BIG, version=BIG, n=n), sender=1, seq=BIG).nbytes)


def _reply_bytes(n: int) -> int:
    """Encoded size of the buffer's sample reply of ``n`` toy trajectories."""
    batch = make_batch(n, torch.Generator().manual_seed(0))
    return int(encode(*protocol.sample_reply(batch, torch.arange(n)), sender=BUFFER, seq=BIG).nbytes)


def _failure_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "refusing to send" in line]


def _check_ended_on_a_refused_send(job, msg_type: str, dst: int, limit: int, senders: tuple[int, ...]) -> None:
    code = job.wait(90)
    out = job.output
    assert code != 0, out
    assert "no heartbeat" not in out and "lost rank" not in out, out
    lines = _failure_lines(out)
    assert lines, out
    pattern = (
        rf"gflowdist: rank (\d+) \((\w+) on [^)]+\) failed(?: at step \d+)?: EncodeError: refusing to send "
        rf"a (\d+)-byte "
        rf"{msg_type} message from rank \1 to rank {dst} \(tag \d+\): over the limit "
        rf"faults\.max_message_bytes = {limit} bytes.*Raise faults\.max_message_bytes to at least \3\b"
    )
    found = [re.search(pattern, line) for line in lines]
    assert any(found), lines
    for match in filter(None, found):
        assert int(match.group(1)) in senders and int(match.group(3)) > limit, match.group(0)
    assert job.no_process_left()


def test_trajectory_batches_and_final_reports_over_the_limit_end_the_job_naming_rank_and_key(local_job_factory):
    """Two jobs: one fails on its first trajectory batch, one on its final reports."""
    n_big = 64
    batch_limit = _trajectory_bytes(n_big) - 1  # every batch of n_big is one byte over
    # Small batches fit; the trainers' final reports (ledger, timers, channel stats: well over 2x a
    # batch of 8) do not. Heartbeats, metrics and summaries are far smaller than a batch.
    replayed = Config.from_yaml(str(TOY)).replay.replayed_per_step(8)  # a sample reply beside 8 fresh
    final_limit = max(_trajectory_bytes(8), _reply_bytes(replayed)) + 64
    # the failing ranks' own failure notices are over the limit too: the collector finds them by their silence,
    # after faults.peer_timeout_s, then waits as long for their post-mortem parts (toy.yaml's 6 s, twice a job)
    quick = "faults.peer_timeout_s=3"
    batches = local_job_factory("run.steps=3", f"params.n={n_big}", f"faults.max_message_bytes={batch_limit}", quick)
    finals = local_job_factory("run.steps=3", f"faults.max_message_bytes={final_limit}", quick)
    _check_ended_on_a_refused_send(batches, "TRAJECTORIES", BUFFER, batch_limit, TRAINERS)
    _check_ended_on_a_refused_send(finals, "LEDGER", 3, final_limit, (*TRAINERS, BUFFER))


def _garbage(comm: LocalComm, count: int) -> None:
    for i in range(count):
        comm.isend(np.frombuffer(b"\x00garbage %06d" % i, dtype=np.uint8), 0, Tags.CONTROL)


def test_the_collector_logs_refused_control_messages_rate_limited_and_counts_them(caplog):
    config = Config.from_dict({"layout": {"trainers": 1, "buffers": 0, "coordinator": False}})
    comm = LocalComm()
    w = Wiring.build(DistributedContext.create(config.layout, comm=comm), config, StopFlag())
    collector = Collector(w, metrics_file=None)
    flood = 2 * LOG_EVERY_REFUSAL + LOG_FIRST_REFUSALS + 3
    _garbage(comm, flood)
    with caplog.at_level(logging.WARNING, logger="gflowdist.runtime"):
        for _ in range(flood):  # poll() reads up to 64 messages and is False when none was valid
            collector.poll()
        collector.wait_finals()  # nobody else: returns at once, with the totals line
    lines = [r.getMessage() for r in caplog.records if "collector refused" in r.getMessage()]
    one_by_one = [
        line for line in lines if "collector refused a control message: malformed message from rank 0" in line
    ]
    thinned = [line for line in lines if re.search(r"refused \d+ control messages so far", line)]
    totals = [line for line in lines if "in total" in line]
    assert len(one_by_one) == LOG_FIRST_REFUSALS
    assert "truncated" in one_by_one[0] and "logged every" in one_by_one[-1]
    assert [int(re.search(r"refused (\d+)", line).group(1)) for line in thinned] == list(
        range(LOG_EVERY_REFUSAL, flood + 1, LOG_EVERY_REFUSAL)
    )
    assert totals == [f"collector refused {flood} control messages in total (rank 0: {flood})"]
    assert len(lines) == LOG_FIRST_REFUSALS + flood // LOG_EVERY_REFUSAL + 1
    assert collector.protocol_errors == flood and collector.refused == {0: flood}
    assert w.ledger.to_dict()["malformed"] == {"0": flood}
