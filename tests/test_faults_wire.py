"""Bad bytes on the wire (promise 1: safe wire): rejected, named, counted; the buffer keeps serving.

All of them come from ``roles.trainer=fault_roles.py:WireAbuseTrainer``
(tests/jobs/fault_roles.py), aimed at the buffer (rank 2) of the toy job:
trainer 1 sends raw bytes that are no gflowdist message on the data tag with
every ``params.garbage_every``-th batch, and one well-formed message larger
than ``faults.max_message_bytes``, or the bare header of a chunked MPI message
claiming 1 TiB.

Each must be refused with a ``ProtocolError`` naming the sender, counted in
the buffer's ledger (``malformed``, outside the balance) and in the final
line, while every real trajectory of every client is still admitted.

The garbage and the oversized message are refused by the channel's decoder,
whatever the engine: that job runs on the ``local`` engine (ranks as threads of
this process, tests/support/local_jobs.py). The chunked MPI header exists only
on MPI: that job runs under mpiexec.
"""

from __future__ import annotations

import re

from tests.support.jobs import layout_rows, read_json

STEPS = 30
N = 8  # params.n of tests/jobs/toy.yaml
EVERY = 3
SENDER = 1  # trainer 1; trainer 0 is the buffer's other client
BUFFER = 2
#: faults.max_message_bytes for these runs: far above every real message of a 30-step toy run (the
#: largest is the buffer's final report, whose timers grow with its idle polls), far below 1 TiB
LIMIT = 4 << 20
#: a toy trajectory is x (4 float32), y and log_rewards (1 float32 each)
TRAJECTORY_BYTES = (4 + 1 + 1) * 4
ABUSER = ["roles.trainer=fault_roles.py:WireAbuseTrainer", f"params.abuse_rank={SENDER}", "params.abuse_after=5"]


def _check_refused_and_served(job, expected_malformed: int) -> list[str]:
    """The run finished balanced with ``expected_malformed`` refusals, all naming SENDER; returns them."""
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    rows = layout_rows(run)
    assert rows[SENDER]["role"] == rows[0]["role"] == "trainer" and rows[BUFFER]["role"] == "buffer"
    assert rows[SENDER]["buffer"] == rows[0]["buffer"] == str(BUFFER)
    log = (run / "logs" / f"rank-{BUFFER}.log").read_text()
    rejected = [line for line in log.splitlines() if "malformed message from rank" in line]
    assert len(rejected) == expected_malformed, log[-3000:]
    assert all(re.search(rf"WARNING .*malformed message from rank {SENDER}\b", line) for line in rejected), rejected
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    assert ledger["per_rank"][str(BUFFER)]["malformed"] == {str(SENDER): expected_malformed}
    assert ledger["totals"]["malformed_messages"] == expected_malformed
    assert f"{expected_malformed} malformed messages rejected" in ledger["final_line"]
    assert ledger["final_line"] in job.output
    # nothing real was lost: every trajectory of both trainers was received and admitted
    finals = read_json(run / "finals.json")
    assert finals[str(BUFFER)]["ledger"]["received_from"] == {"0": STEPS * N, str(SENDER): STEPS * N}
    assert ledger["totals"]["admitted"] == ledger["totals"]["produced"] == 2 * STEPS * N
    assert finals[str(BUFFER)]["replay"]["sampled"] > 0  # it kept answering sample requests
    assert job.no_process_left()
    return rejected


def test_garbage_and_an_oversized_message_are_refused_naming_the_sender_and_counted(local_job_factory):
    oversized = LIMIT // TRAJECTORY_BYTES + 1  # its frames alone exceed the limit
    job = local_job_factory(
        f"run.steps={STEPS}",
        f"faults.max_message_bytes={LIMIT}",
        *ABUSER,
        "params.abuse=oversized",
        f"params.abuse_trajectories={oversized}",
        f"params.garbage_every={EVERY}",
    )
    # one garbage message with batches EVERY, 2 EVERY, ... (all read before the sender's "done"
    # notice, which follows them on the same tag), plus the oversized one
    rejected = _check_refused_and_served(job, STEPS // EVERY + 1)
    assert sum("not a gflowdist message" in line for line in rejected) == STEPS // EVERY
    assert sum(str(LIMIT) in line for line in rejected) == 1, rejected


def test_a_header_claiming_a_terabyte_is_refused_before_allocation(job_factory):
    job = job_factory(
        f"run.steps={STEPS}",
        f"faults.max_message_bytes={LIMIT}",
        *ABUSER,
        "params.abuse=claim",
        f"params.abuse_bytes={1 << 40}",
    )
    rejected = _check_refused_and_served(job, 1)
    assert str(1 << 40) in rejected[0] and str(LIMIT) in rejected[0], rejected
