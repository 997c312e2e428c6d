"""Garbage on the wire (promise 1: safe wire): rejected, named, counted, and the buffer keeps serving.

``GFLOWDIST_INJECT_GARBAGE=<rank>:<every>`` (the runtime's test hook in
gflowdist/runtime/loops.py) makes that producer send raw bytes that are no
gflowdist message on the data tag to its buffer after every ``every``-th
batch. The buffer must reject each with a ``ProtocolError`` naming the
sender, count it in its ledger's ``malformed`` (outside the balance), and go
on serving everyone, the sender included.
"""

from __future__ import annotations

import re

from jobs.job import job_factory, layout_rows, read_json  # noqa: F401 (fixture)

STEPS = 30
N = 8  # params.n of tests/jobs/toy.yaml
EVERY = 3
SENDER = 1  # trainer 1; trainer 0 is the buffer's other client
BUFFER = 2


def test_garbage_is_rejected_naming_the_sender_and_counted_while_the_buffer_serves(job_factory):
    job = job_factory(f"run.steps={STEPS}", env={"GFLOWDIST_INJECT_GARBAGE": f"{SENDER}:{EVERY}"})
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    rows = layout_rows(run)
    assert rows[SENDER]["role"] == "trainer" and rows[0]["role"] == "trainer"
    assert rows[BUFFER]["role"] == "buffer" and rows[SENDER]["buffer"] == rows[0]["buffer"] == str(BUFFER)
    # one garbage message after batches EVERY, 2 EVERY, ...; all are read before the sender's
    # "done" notice, which follows them on the same tag
    expected = STEPS // EVERY
    log = (run / "logs" / f"rank-{BUFFER}.log").read_text()
    rejected = [line for line in log.splitlines() if "malformed message from rank" in line]
    assert len(rejected) == expected, log[-3000:]
    assert all(re.search(rf"WARNING .*malformed message from rank {SENDER}\b", line) for line in rejected), rejected
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    assert ledger["per_rank"][str(BUFFER)]["malformed"] == {str(SENDER): expected}
    assert ledger["totals"]["malformed_messages"] == expected
    assert f"{expected} malformed messages rejected" in ledger["final_line"]
    assert ledger["final_line"] in job.output
    # nothing real was lost: every trajectory of both trainers was received and admitted
    finals = read_json(run / "finals.json")
    received_from = finals[str(BUFFER)]["ledger"]["received_from"]
    assert received_from == {"0": STEPS * N, str(SENDER): STEPS * N}
    assert ledger["totals"]["admitted"] == ledger["totals"]["produced"] == 2 * STEPS * N
    assert finals[str(BUFFER)]["replay"]["sampled"] > 0  # it kept answering sample requests
    assert job.no_process_left()
