"""A user's batch mistakes made in a real job (issue 23 item 2, issue 26's refused batch).

Toy jobs (trainers 0-1, buffer 2, coordinator 3; with ``-n 3`` trainer 0, buffer 1, coordinator 2); a
trainer makes the mistake. The first runs under mpiexec (the console of a real launcher: the failure once,
no MPI_Abort noise, the partial report); while it runs, the others run on the ``local`` engine (ranks as
threads of this process: the same loops, the same buffer and the same messages; tests/support/local_jobs.py):

- its rollout returns a list: the job fails with ``ToyTrainer.rollout returned a list: ...`` (before:
  ``AttributeError: 'list' object has no attribute 'values'`` from loops/client.py), printed once;
- its batch's ``x`` grows a column at step 5, under ``faults.on_bad_batch: fail``: the job fails with the
  buffer's words, naming the field, what arrived and what is stored, and ``ToyTrainer.rollout`` (before:
  torch's ``Sizes of tensors must match`` from ``concat_batches``);
- the same under ``faults.on_bad_batch: drop``: the run goes on to its end, every changed batch refused and
  counted against rank 1, the ledger balanced (before: the same crash as under ``fail``);
- (``-n 3``) its ``y`` has one row less than its other fields: each field named with its rows (before:
  ``found sizes [7, 8]``); a NaN in its ``log_rewards`` under ``faults.on_nonfinite_batch: fail``: the field
  and the row named.
"""

from __future__ import annotations

import re

from tests.support.jobs import read_json

FAST = ("faults.heartbeat_s=0.2", "faults.peer_timeout_s=4")
GROW = ("params.mistake_rank=1", "params.mistake=grow", "params.mistake_at=5")


def _failed_once(out: str, pattern: str) -> None:
    """The failure is on the console once, in the user's terms, without a framework traceback or MPI noise."""
    assert len(re.findall(pattern, out)) == 1, out
    assert "Traceback" not in out and "MPI_Abort" not in out and "concat_batches" not in out, out
    assert re.search(r"the whole traceback: \S+/logs/rank-\d\.log", out), out


def test_batch_mistakes_are_named_in_the_users_terms_and_a_refused_batch_never_crashes_its_sender(
    job_factory, local_job_factory
):
    listed = job_factory("run.steps=20", "params.mistake_rank=1", "params.mistake=list", *FAST)  # under mpiexec
    fails = local_job_factory("run.steps=20", *GROW, *FAST)
    drops = local_job_factory("run.steps=20", *GROW, "faults.on_bad_batch=drop", *FAST)
    rows = local_job_factory("run.steps=5", "-n", "3", "params.mistake_rank=0", "params.mistake=rows", *FAST)
    nan = local_job_factory(
        "run.steps=5", "-n", "3", "params.mistake_rank=0", "params.mistake=nan", "faults.on_nonfinite_batch=fail", *FAST
    )
    codes = [job.wait(150) for job in (listed, fails, drops, rows, nan)]

    out = listed.output
    assert codes[0] == 1, out
    _failed_once(
        out,
        r"gflowdist: rank 1 \(trainer on \S+\) failed at step 0: BatchError: ToyTrainer.rollout returned a list: "
        r"a batch is a dict of tensors, one row per trajectory",
    )
    assert "AttributeError" not in out and "raised by gflowdist: runtime/loops/batches.py" in out
    assert (listed.run_dir() / "report.txt").read_text().startswith("gflowdist run report -- PARTIAL")

    out = fails.output
    assert codes[1] == 1, out
    _failed_once(
        out,
        r"gflowdist: rank 1 \(trainer on \S+\) failed at step 5: BadBatchError: buffer rank 2 \(buffer on \S+\) "
        r"refused a batch of 8 trajectories \(seq 40-47\) from rank 1 \(trainer on \S+\): field 'x': got per-item "
        r"shape \[5\] torch.float32, the storage holds \[4\] torch.float32 \(faults.on_bad_batch = fail; 'drop' "
        r"would count it and go on\); ToyTrainer.rollout made it at step 5",
    )
    assert "Sizes of tensors must match" not in out

    out = drops.output
    assert codes[2] == 0, out
    ledger = read_json(drops.run_dir() / "ledger.json")
    buffer = ledger["per_rank"]["2"]
    assert ledger["balanced"] and buffer["refused"] == {"1": 15} and buffer["dropped"] == {"bad_batch": 15 * 8}
    assert "15 batches refused (from rank 1: 15)" in ledger["final_line"]
    assert read_json(drops.run_dir() / "finals.json")["1"]["step"] == 20
    log = (drops.run_dir() / "logs" / "rank-1.log").read_text()
    assert "ToyTrainer.rollout made it at step 5" in log and "step 5 learns from its 8 replayed items alone" in log

    assert codes[3] == 1, rows.output
    _failed_once(
        rows.output,
        r"gflowdist: rank 0 \(trainer on \S+\) failed at step 0: BatchError: ToyTrainer.rollout returned fields with "
        r"different numbers of rows: 'x' 8, 'y' 7, 'log_rewards' 8; every field needs one row per trajectory",
    )
    assert codes[4] == 1, nan.output
    _failed_once(
        nan.output,
        r"gflowdist: rank 0 \(trainer on \S+\) failed at step 0: BatchError: ToyTrainer.rollout returned NaN in field "
        r"'log_rewards' \(row 2 of 8\) \(faults.on_nonfinite_batch = fail; 'allow' would ship it\)",
    )
    for job in (listed, fails, drops, rows, nan):
        assert job.no_process_left()
