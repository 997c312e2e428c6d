"""Keep training through faults, through the real CLI under mpiexec (issue 17's items 3-5).

One launch of three toy jobs (a few ms a step) side by side; the trainers
sleep 0.1 s a rollout where a kill is due, and one loop watches both jobs to
be killed, so a kill cannot come after the job it was meant for ended:

- ``restart``: trainer 1 killed with ``kill -9`` under ``faults.max_restarts: 1``
  and periodic checkpoints: the launcher restarts the same layout from the
  newest checkpoint; every step is done, exit 0, one restart recorded, each
  ``(rank, step)`` once in metrics.jsonl, the ledger balanced; the console
  and the report say which generation, why the one before ended and how
  many steps it repeats;
- ``going on``: the actor killed with ``kill -9`` under ``faults.on_actor_loss:
  continue``, while trainer 1's batches change type from step 5 under
  ``faults.on_bad_batch: drop`` and trainer 0's loss is NaN at step 7 under
  ``faults.on_nonfinite_loss: skip``: the run finishes without the actor,
  names it, writes its ledger with what it produced and no buffer received as
  ``dropped["lost_rank"]``; the buffer refuses trainer 1's batches naming
  rank, role, field, expected and got, counts them against it and keeps
  serving everyone; the NaN step is skipped naming rank and step; balanced;
  each of these faults an instant event in trace.json on the rank that saw it;
- ``same twice``: the bad batch under ``faults.on_bad_batch: fail`` and
  ``max_restarts: 2``: the sender's run fails with the buffer's words, is
  restarted once, fails the same way at the same step and is not restarted
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
STEPS = 40
#: trainer 1's batches turn float64 from policy version 5: the buffer's storage holds float32
RETYPE = ("params.retype_rank=1", "params.retype_at=5")
REFUSAL = (
    r"buffer rank {buffer} \(buffer on \S+\) refused a batch of 8 trajectories \(seq 40-47\) from rank 1 "
    r"\(trainer on \S+\): field 'y': got per-item shape \[\] torch.float64, the storage holds \[\] "
    r"torch.float32"
)


def _keys(run: Path) -> list[tuple[int, int]]:
    """``(rank, step)`` of every metrics row written whole so far."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip().endswith("}")]
    return [(row["rank"], row["step"]) for row in rows]


def _kill_when(triggers: dict, timeout: float = 150) -> None:
    """``{job: (what, ready(run_dir), rank)}``: ``kill -9`` each job's ``rank`` once its ``ready`` holds.

    The jobs are watched together, so one job's slow start-up cannot let another finish before its kill.
    """
    deadline = time.monotonic() + timeout
    while triggers:
        for job, (what, ready, rank) in list(triggers.items()):
            if job.proc.poll() is not None:
                raise AssertionError(f"job ended ({job.proc.returncode}) before {what}:\n{job.output}")
            runs = list(job.out_dir.glob("*/metrics.jsonl"))
            if runs and ready(runs[0].parent):
                os.kill(pid_of_rank(runs[0].parent, rank), signal.SIGKILL)
                del triggers[job]
        assert time.monotonic() < deadline, f"not every kill after {timeout} s: {[t[0] for t in triggers.values()]}"
        time.sleep(0.1)


def test_training_goes_on_through_a_lost_trainer_a_lost_actor_bad_batches_and_a_nan_loss(job_factory):
    # trainers sleep 0.1 s a rollout where a kill is due (from step 12; the whole run): time for the kill
    restart = job_factory(
        f"run.steps={STEPS}",
        "run.log_every=1",
        "params.delay_s=0.03",
        "params.slow_from=12",
        "params.slow_s=0.1",
        "faults.checkpoint_every=8",
        "--max-restarts",
        "1",
        *FAST,
    )
    going_on = job_factory(
        f"run.steps={STEPS}",
        "layout.actors=1",
        "-n",
        "5",
        "params.delay_s=0.03",
        "params.slow_s=0.1",
        "faults.on_actor_loss=continue",
        *RETYPE,
        "faults.on_bad_batch=drop",
        "params.nan_rank=0",
        "params.nan_at=7",
        "faults.on_nonfinite_loss=skip",
        *FAST,
    )
    twice = job_factory("run.steps=20", *RETYPE, "faults.checkpoint_every=2", "--max-restarts", "2", *FAST)
    _kill_when(
        {
            # trainer 1 (trainers 0-1, buffer 2, coordinator 3) at step 12, after a periodic checkpoint
            restart: ("trainer 1's step 12 and a checkpoint", lambda run: candidates(run) and (1, 12) in _keys(run), 1),
            # the actor (trainers 0-1, actor 2, buffer 3, coordinator 4) once the trainers are training
            going_on: ("the first metrics rows", lambda run: len(_keys(run)) >= 2, 2),
        }
    )
    codes = [job.wait(240) for job in (restart, going_on, twice)]

    _check_restarted(restart, restart.run_dir(), codes[0])
    _check_went_on(going_on, going_on.run_dir(), codes[1])
    _check_not_restarted_twice(twice, codes[2])


def _check_restarted(job, run: Path, code: int) -> None:
    out = job.output
    assert code == 0, out
    assert "lost rank 1 (trainer on" in out and "restart 1 of 1" in out, out
    restarts = read_json(run / "restarts.json")
    assert len(restarts) == 1 and restarts[0]["previous_ended"].startswith("lost rank 1 (trainer on"), restarts
    note = re.search(
        r"generation 1 \(restart 1 of 1\); the one before ended: lost rank 1 \(trainer on \S+\): "
        r"[^;]*; resumed from gen-0000-step-0+(\d+) at step (\d+), (\d+) steps? repeated",
        out,
    )
    assert note and note[1] == note[2] and int(note[3]) >= 0, out
    assert re.search(rf"^gen 1  step \d+/{STEPS}", out, re.M), out
    assert "generation 1 (restart 1 of 1)" in (run / "report.txt").read_text()
    finals = read_json(run / "finals.json")
    assert [finals[str(r)]["step"] for r in (0, 1)] == [STEPS, STEPS]
    keys = _keys(run)
    assert len(keys) == len(set(keys)) and set(keys) == {(r, s) for r in (0, 1) for s in range(STEPS)}
    assert read_json(run / "ledger.json")["balanced"]
    assert job.no_process_left()


def _check_went_on(job, run: Path, code: int) -> None:
    out = job.output
    assert code == 0, out
    assert re.search(
        r"gflowdist: lost rank 2 \(actor on \S+\): no heartbeat for [\d.]+ s \(faults.peer_timeout_s = "
        r"4\); going on without it \(faults.on_actor_loss = continue\)",
        out,
    ), out
    assert "lost rank 2 (actor)" in out  # on the progress line
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["2"], ledger
    assert "went on without rank 2" in ledger["final_line"] and ledger["final_line"] in out
    lost = ledger["per_rank"]["2"]
    received = sum(int(r["received_from"].get("2", 0)) for r in ledger["per_rank"].values())
    assert received > 0 and lost["produced"] == received + lost["dropped"].get("lost_rank", 0), ledger
    assert ledger["totals"]["produced"] == ledger["totals"]["admitted"] + ledger["totals"]["dropped"]
    finals = read_json(run / "finals.json")
    assert [finals[str(r)]["step"] for r in (0, 1)] == [STEPS, STEPS] and finals["2"]["lost"]
    assert "went on without rank 2" in (run / "report.txt").read_text()
    # trainer 1's batches from step 5 on: refused, counted against it; everything else its buffer got, admitted
    refused = STEPS - 5
    buffer = ledger["per_rank"]["3"]
    assert buffer["refused"] == {"1": refused} and buffer["dropped"] == {"bad_batch": refused * 8}, buffer
    assert buffer["received_from"]["0"] == buffer["received_from"]["1"] == STEPS * 8, buffer
    assert buffer["admitted"] == buffer["received"] - refused * 8, buffer
    assert f"{refused} batches refused (from rank 1: {refused})" in ledger["final_line"]
    warnings = (run / "logs" / "rank-1.log").read_text()
    assert re.search(REFUSAL.format(buffer=3) + r": dropped \(faults.on_bad_batch = drop\)", warnings), warnings
    assert "rank 0: the loss is nan at step 7: step skipped" in (run / "logs" / "rank-0.log").read_text()
    replayed = finals["0"]["staleness"]
    assert sum(replayed.values()) > 0  # the buffer kept serving trainer 0's sample requests
    _check_fault_instants(run, refused)
    assert job.no_process_left()


def _check_fault_instants(run: Path, refused: int) -> None:
    """trace.json: each fault an instant event on the track of the rank that saw it."""
    instants = [e for e in read_json(run / "trace.json")["traceEvents"] if e["ph"] == "i" and e["cat"] == "fault"]
    seen = {(e["pid"], e["name"]) for e in instants}
    assert {(4, "rank lost"), (3, "batch refused"), (1, "batch refused"), (0, "non-finite loss")} <= seen, seen
    assert all(e["args"]["rank"] == 2 for e in instants if e["name"] == "rank lost")
    assert sum(e["pid"] == 3 and e["name"] == "batch refused" for e in instants) == refused
    assert [e["args"] for e in instants if e["name"] == "non-finite loss"] == [{"step": 7}]


def _check_not_restarted_twice(job, code: int) -> None:
    out = job.output
    assert code not in (0, 2), out
    failed = r"rank 1 \(trainer on \S+\) failed at step \d+: BadBatchError: " + REFUSAL.format(buffer=2)
    assert len(re.findall("the job failed \\(exit \\d+\\):\ngflowdist: " + failed, out)) == 2, out
    assert "restart 1 of 2" in out and "restart 2 of 2" not in out
    assert "not restarting: the same exception at step" in out, out
    assert len(read_json(job.run_dir() / "restarts.json")) == 1
    assert job.no_process_left()
