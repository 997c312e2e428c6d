"""Keep training through faults, through the real CLI under mpiexec (issue 17's items 3-5).

Two launches of two jobs each, side by side, on the toy job (a few ms a step):

- a trainer killed with ``kill -9`` under ``faults.max_restarts: 1`` and
  periodic checkpoints: the launcher restarts the same layout from the newest
  checkpoint; every step is done, exit 0, one restart recorded, each
  ``(rank, step)`` once in metrics.jsonl, the ledger balanced; the console
  and the report say which generation, why the one before ended and how
  many steps it repeats;
- an actor killed with ``kill -9`` under ``faults.on_actor_loss: continue``:
  the run finishes without it, names it, writes its ledger with what it
  produced and no buffer received as ``dropped["lost_rank"]``, and balances;
- a trainer whose batches change type under ``faults.on_bad_batch: drop``
  while the other trainer's loss is NaN at one step under
  ``faults.on_nonfinite_loss: skip``: the buffer refuses the batches naming
  rank, role, field, expected and got, counts them against the sender and
  keeps serving both; the NaN step is skipped naming rank and step;
- the same fault under ``faults.on_bad_batch: fail`` and
  ``max_restarts: 2``: the sender's run fails with the buffer's words, is
  restarted once, fails the same way at the same place and is not restarted
  again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from gflowdist.runtime.checkpoints import candidates
from tests.support.jobs import pid_of_rank, read_json

FAST = ("faults.heartbeat_s=0.2", "faults.peer_timeout_s=4", "faults.restart_delay_s=0")


def _keys(run: Path) -> list[tuple[int, int]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(row["rank"], row["step"]) for row in rows]


def _wait_for(what, predicate, job, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if job.proc.poll() is not None:
            raise AssertionError(f"job ended ({job.proc.returncode}) before {what}:\n{job.output}")
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{job.output}"
        time.sleep(0.1)


def test_a_killed_trainer_is_restarted_and_a_killed_actor_is_gone_on_without(job_factory):
    steps = 40
    restart = job_factory(f"run.steps={steps}", "run.log_every=1", "params.delay_s=0.03",
                          "faults.checkpoint_every=8", "--max-restarts", "1", *FAST)
    actors = job_factory(f"run.steps={steps}", "layout.actors=1", "-n", "5", "params.delay_s=0.03",
                         "faults.on_actor_loss=continue", *FAST)
    run_r = restart.wait_for_metrics(1)
    run_a = actors.wait_for_metrics(1)
    _wait_for("a periodic checkpoint", lambda: candidates(run_r), restart)
    _wait_for("step 12", lambda: (1, 12) in _keys(run_r), restart)
    os.kill(pid_of_rank(run_r, 1), signal.SIGKILL)  # trainer 1 (trainers 0-1, buffer 2, coordinator 3)
    _wait_for("10 steps", lambda: len(_keys(run_a)) >= 2, actors)
    os.kill(pid_of_rank(run_a, 2), signal.SIGKILL)  # the actor (trainers 0-1, actor 2, buffer 3, coordinator 4)
    code_r, code_a = restart.wait(240), actors.wait(240)

    out = restart.output
    assert code_r == 0, out
    assert "lost rank 1 (trainer on" in out and "restart 1 of 1" in out, out
    restarts = read_json(run_r / "restarts.json")
    assert len(restarts) == 1 and restarts[0]["previous_ended"].startswith("lost rank 1 (trainer on"), restarts
    note = re.search(r"generation 1 \(restart 1 of 1\); the one before ended: lost rank 1 \(trainer on \S+\): "
                     r"[^;]*; resumed from gen-0000-step-0+(\d+) at step (\d+), (\d+) steps repeated", out)
    assert note and note[1] == note[2] and int(note[3]) >= 0, out
    assert re.search(rf"^gen 1  step \d+/{steps}", out, re.M), out
    assert "generation 1 (restart 1 of 1)" in (run_r / "report.txt").read_text()
    finals = read_json(run_r / "finals.json")
    assert [finals[str(r)]["step"] for r in (0, 1)] == [steps, steps]
    keys = _keys(run_r)
    assert len(keys) == len(set(keys)) and set(keys) == {(r, s) for r in (0, 1) for s in range(steps)}
    assert read_json(run_r / "ledger.json")["balanced"]
    assert restart.no_process_left()

    out = actors.output
    assert code_a == 0, out
    assert re.search(r"gflowdist: lost rank 2 \(actor on \S+\): no heartbeat for [\d.]+ s \(faults.peer_timeout_s = "
                     r"4\); going on without it \(faults.on_actor_loss = continue\)", out), out
    assert "lost rank 2 (actor)" in out  # on the progress line
    ledger = read_json(run_a / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["2"], ledger
    assert "went on without rank 2" in ledger["final_line"] and ledger["final_line"] in out
    lost = ledger["per_rank"]["2"]
    received = sum(int(r["received_from"].get("2", 0)) for r in ledger["per_rank"].values())
    assert received > 0 and lost["produced"] == received + lost["dropped"].get("lost_rank", 0), ledger
    assert ledger["totals"]["produced"] == ledger["totals"]["admitted"] + ledger["totals"]["dropped"]
    finals = read_json(run_a / "finals.json")
    assert [finals[str(r)]["step"] for r in (0, 1)] == [steps, steps] and finals["2"]["lost"]
    assert "went on without rank 2" in (run_a / "report.txt").read_text()
    assert actors.no_process_left()


def test_a_bad_batch_is_refused_and_counted_and_a_nan_loss_is_caught_at_its_step(job_factory):
    faults = ("params.retype_rank=1", "params.retype_at=5")  # trainer 1's batches turn float64 at version 5
    drop = job_factory("run.steps=20", *faults, "faults.on_bad_batch=drop", "params.nan_rank=0", "params.nan_at=7",
                       "faults.on_nonfinite_loss=skip", *FAST)
    fail = job_factory("run.steps=20", *faults, "faults.checkpoint_every=2", "--max-restarts", "2", *FAST)
    code_d, code_f = drop.wait(240), fail.wait(240)

    out, run = drop.output, drop.run_dir()
    assert code_d == 0, out
    ledger = read_json(run / "ledger.json")
    buffer = ledger["per_rank"]["2"]
    assert ledger["balanced"] and buffer["refused"] == {"1": 15} and buffer["dropped"] == {"bad_batch": 15 * 8}
    assert buffer["received_from"] == {"0": 160, "1": 160} and buffer["admitted"] == 160 + 5 * 8
    assert "15 batches refused (from rank 1: 15)" in ledger["final_line"]
    warnings = (run / "logs" / "rank-1.log").read_text()
    assert re.search(r"buffer rank 2 \(buffer on \S+\) refused a batch of 8 trajectories \(seq 40-47\) from rank 1 "
                     r"\(trainer on \S+\): field 'y': got per-item shape \[\] torch.float64, the storage holds \[\] "
                     r"torch.float32: dropped \(faults.on_bad_batch = drop\)", warnings), warnings
    assert "rank 0: the loss is nan at step 7: step skipped" in (run / "logs" / "rank-0.log").read_text()
    replayed = read_json(run / "finals.json")["0"]["staleness"]
    assert sum(replayed.values()) > 0  # the buffer kept serving trainer 0's sample requests
    assert drop.no_process_left()

    out = fail.output
    assert code_f not in (0, 2), out
    refused = (r"rank 1 \(trainer on \S+\) failed at step \d+: BadBatchError: buffer rank 2 \(buffer on \S+\) refused "
               r"a batch of 8 trajectories \(seq 40-47\) from rank 1 \(trainer on \S+\): field 'y': got per-item "
               r"shape \[\] torch.float64, the storage holds \[\] torch.float32")
    assert len(re.findall("the job failed \\(exit \\d+\\):\ngflowdist: " + refused, out)) == 2, out
    assert "restart 1 of 2" in out and "restart 2 of 2" not in out
    assert "not restarting: the same exception at step" in out, out
    assert len(read_json(fail.run_dir() / "restarts.json")) == 1
    assert fail.no_process_left()
