"""``faults.on_actor_loss: replace`` with real ranks: the real CLI under mpiexec, an actor killed with kill -9.

Two toy jobs side by side (trainers 0-1, actor 2, buffer 3, coordinator 4), the actor of each killed once
the trainers are training:

- ``replaced``: a new actor, started with MPI_Comm_spawn, takes rank 2's place; its metrics rows count
  its trajectories from zero again; after it shipped, the launcher gets SIGTERM (a clean stop): the
  ledger balances over both actors (rank 2's row holds the lost one's and the replacement's counts,
  the lost one's undelivered items as ``dropped["lost_rank"]``), ledger.json names the replaced rank;
- ``not started``: the replacement fails in its role's setup(): it is named as not started, and the job
  goes on without rank 2 (as under ``continue``) to its last step, the ledger balanced.

A third, smaller job (trainer 0 = collector, actor 1, buffer 2) has its spare actor die at the worst moment:
right after the collector made it rank 1 and told its trainer and buffer so
(``GFLOWDIST_STANDIN_FAULT=on-call``). Nobody waits on it: the collector names it as not started within
``faults.startup_timeout_s``, the job goes on without rank 1 and stops cleanly; no process is left.

A fourth (trainer 0 = collector, actor 1, buffer 2) has its spare die while idle
(``GFLOWDIST_STANDIN_FAULT=idle``): its heartbeats stop, the collector names it within ``faults.peer_timeout_s``
with none left (and tells every rank: hydra signalled its end as a rank's death, after which nobody sends to an
actor until a death is named; before, the actor then heard nothing from the collector and ended the job blaming
it), and when the actor is then killed, the line about the loss says no spare is left and the job
goes on without it at once (no replacement is tried, nothing waits ``faults.startup_timeout_s``).

The replaced job is then resumed (``--resume``) for 10 more steps: its final checkpoint's manifest keeps the
lost process's counts, so rank 2's ledger carries them on and the resumed run balances too; so does the
``not started`` job, resumed for 5 (rank 2's slot holds the counts of its last process, the one that never
started, and the manifest the replaced one's). Every process of
the jobs (launcher, mpiexec, proxies, ranks, the spawned one) is gone at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from gflowdist.standin import FAULT_VARIABLE
from tests.support.jobs import pid_of_rank, read_json

FAST = ("faults.heartbeat_s=0.2", "faults.peer_timeout_s=4", "faults.on_actor_loss=replace", "faults.max_restarts=1")
JOB = ("layout.actors=1", "-n", "5", "run.log_every=1", "params.delay_s=0.03", "params.actor_metrics=1", *FAST)


def _rows(run: Path, rank: int) -> list[dict]:
    """The whole metrics rows of ``rank``, in file order."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    return [row for row in rows if row["rank"] == rank]


def _actor_rows(run: Path) -> list[int]:
    """The ``trajectories`` count of each whole metrics row of actor rank 2, in file order."""
    return [row["trajectories"] for row in _rows(run, 2) if "trajectories" in row]


def _restarted_at(counts: list[int]) -> int | None:
    """The index of the first row of the replacement: where the count falls back."""
    return next((i for i in range(1, len(counts)) if counts[i] <= counts[i - 1]), None)


def _wait_for(what: str, ready, job, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert job.proc.poll() is None, f"job ended ({job.proc.returncode}) before {what}:\n{job.output}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{job.output}"
        time.sleep(0.2)


def test_a_killed_actor_is_replaced_counted_from_zero_with_an_exact_ledger_or_named_when_it_cannot_start(
    job_factory,
):
    replaced = job_factory("run.steps=100000", *JOB)
    failing = job_factory("run.steps=150", *JOB, "params.fail_standin=1", "faults.startup_timeout_s=20")
    small = ("layout.actors=1", "layout.coordinator=false", "-n", "3", "run.log_every=1", "params.delay_s=0.03")
    dying = job_factory(
        "run.steps=100000", *small, *FAST, "faults.startup_timeout_s=20", env={FAULT_VARIABLE: "on-call"}
    )
    runs = {job: job.wait_for_metrics(4, timeout=180) for job in (replaced, failing, dying)}
    for job, run in runs.items():
        if job is not dying:
            _wait_for("metrics of the actor", lambda run=run: len(_actor_rows(run)) >= 2, job)
        os.kill(pid_of_rank(run, 1 if job is dying else 2), signal.SIGKILL)

    _wait_for(
        "the replacement named as not started", lambda: "its replacement sent no heartbeat" in dying.output, dying
    )
    trained = len(_rows(runs[dying], 0))
    _wait_for("the job going on", lambda: len(_rows(runs[dying], 0)) >= trained + 3, dying)
    dying.proc.send_signal(signal.SIGTERM)
    assert dying.wait(120) == 143, dying.output
    _check_died_on_call(dying.output, runs[dying])

    run = runs[replaced]
    _wait_for(
        "replacement shipping",
        lambda: (_restarted_at(_actor_rows(run)) or 10**9) + 3 <= len(_actor_rows(run)),
        replaced,
    )
    replaced.proc.send_signal(signal.SIGTERM)  # a clean stop: report, checkpoint, ledger
    assert replaced.wait(120) == 143, replaced.output
    _check_replaced(replaced.output, run)
    assert failing.wait(240) == 0, failing.output
    _check_not_started(failing.output, runs[failing])
    assert replaced.no_process_left() and failing.no_process_left() and dying.no_process_left()
    # the final checkpoint's manifest keeps the lost process's counts: a resumed run balances to its end
    earlier = read_json(run / "ledger.json")["per_rank"]["2"]
    reached = read_json(run / "finals.json")["0"]["step"]
    resumed = job_factory("--resume", str(run), f"run.steps={reached + 10}", config=None)
    resumed.out_dir = run.parent
    # the failing job's rank 2 was a replaced process, then one that never started: its slot holds only that
    # one's counts (it held every process's, and the manifest added the replaced one's again)
    gone = runs[failing]
    gone_reached = read_json(gone / "finals.json")["0"]["step"]
    resumed_gone = job_factory("--resume", str(gone), f"run.steps={gone_reached + 5}", config=None)
    resumed_gone.out_dir = gone.parent
    assert resumed_gone.wait(180) == 0, resumed_gone.output
    ledger = read_json(gone / "ledger.json")
    assert ledger["balanced"] and read_json(gone / "finals.json")["0"]["step"] == gone_reached + 5, ledger
    assert resumed_gone.no_process_left()
    assert resumed.wait(180) == 0, resumed.output
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and read_json(run / "finals.json")["0"]["step"] == reached + 10, ledger
    assert ledger["per_rank"]["2"]["produced"] > earlier["produced"], (earlier, ledger["per_rank"]["2"])
    assert ledger["per_rank"]["2"]["dropped"] == earlier["dropped"]
    assert resumed.no_process_left()


def test_a_spare_that_dies_while_idle_is_named_and_never_called(job_factory):
    small = (
        "layout.actors=1",
        "layout.coordinator=false",
        "-n",
        "3",
        "run.log_every=1",
        "params.delay_s=0.03",
        "params.actor_metrics=1",
    )
    job = job_factory("run.steps=100000", *small, *FAST, "faults.startup_timeout_s=60", env={FAULT_VARIABLE: "idle"})
    run = job.wait_for_metrics(4, timeout=180)
    _wait_for("the spare named", lambda: "fell silent while idle" in job.output, job)
    # its end made hydra signal every rank (SIGUSR1) as for a rank's death; once it is named, the trainer sends
    # its actor weights again
    updates = [row["weight_updates"] for row in _rows(run, 1) if "weight_updates" in row][-1]
    _wait_for(
        "weights reaching the actor again",
        lambda: any(row.get("weight_updates", 0) >= updates + 3 for row in _rows(run, 1)),
        job,
        timeout=60,
    )
    os.kill(pid_of_rank(run, 1), signal.SIGKILL)
    _wait_for("the actor's loss", lambda: "lost rank 1 " in job.output, job)
    trained = len(_rows(run, 0))
    _wait_for("the job going on", lambda: len(_rows(run, 0)) >= trained + 3, job)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(120) == 143, job.output
    out = job.output
    assert re.search(
        r"^gflowdist: spare actor 1 of 1 fell silent while idle \(no heartbeat for [\d.]+ s "
        r"\(faults.peer_timeout_s = 4\)\): it replaces no lost actor; 0 spares left$",
        out,
        re.M,
    ), out
    assert re.search(
        r"^gflowdist: lost rank 1 \(actor on \S+\): no heartbeat for [\d.]+ s \(faults.peer_timeout_s = 4\); "
        r"going on without it \(faults.on_actor_loss = replace; no spare actor left \(0 called, 1 fell silent "
        r"while idle\)\)$",
        out,
        re.M,
    ), out
    assert "replacing rank" not in out and "its replacement sent no heartbeat" not in out, out
    assert out.index("fell silent while idle") < out.index("lost rank 1 ")
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["1"] and not ledger.get("replaced_ranks"), ledger
    assert "spare actor 1 of 1 fell silent while idle" in (run / "report.txt").read_text()
    assert job.no_process_left()


def _check_replaced(out: str, run: Path) -> None:
    assert re.search(
        r"^gflowdist: lost rank 2 \(actor on \S+\): no heartbeat for [\d.]+ s \(faults.peer_timeout_s = 4\); "
        r"going on without it \(faults.on_actor_loss = replace\)$",
        out,
        re.M,
    ), out
    assert re.search(
        r"^gflowdist: replacing rank 2 \(actor on \S+\) \(lost: no heartbeat .*\): spare actor 1 of 1, started "
        r"with MPI_Comm_spawn, takes its place$",
        out,
        re.M,
    ), out
    log = (run / "logs" / "rank-2.log").read_text()
    assert re.search(r"rank 2: a replacement \(number 1\) in pid \d+, started with MPI_Comm_spawn", log), log
    counts = _actor_rows(run)
    start = _restarted_at(counts)
    assert start is not None and counts[start] <= 8 * 2, counts  # counted from zero: a batch or two
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["replaced_ranks"]) == ["2"] and ledger["lost_ranks"] == {}, ledger
    assert "replaced rank 2" in ledger["final_line"] and ledger["final_line"] in out
    finals = read_json(run / "finals.json")
    [earlier] = finals["2"]["replaced"]
    lost = earlier["ledger"]
    mine = ledger["per_rank"]["2"]
    received = ledger["per_rank"]["3"]["received_from"]["2"]
    assert lost["produced"] >= counts[start - 1] and mine["produced"] > lost["produced"], (lost, mine)
    assert mine["produced"] == received + mine["dropped"].get("lost_rank", 0), (mine, received)
    assert mine["dropped"].get("lost_rank", 0) == lost["dropped"].get("lost_rank", 0)
    assert mine["produced"] - lost["produced"] >= counts[-1]  # the replacement's own count, from zero
    assert "replaced rank 2 (lost: no heartbeat" in (run / "report.txt").read_text()


def _check_not_started(out: str, run: Path) -> None:
    assert "the toy actor's replacement fails on purpose" in (run / "logs" / "rank-2.log").read_text()
    assert re.search(
        r"^gflowdist: lost rank 2 \(actor on \S+\): its replacement sent no heartbeat within "
        r"faults.startup_timeout_s \([\d.]+ s; its log: logs/rank-2.log\); going on without it",
        out,
        re.M,
    ), out
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["2"], ledger
    assert "went on without rank 2" in ledger["final_line"]
    assert [read_json(run / "finals.json")[str(r)]["step"] for r in (0, 1)] == [150, 150]


def _check_died_on_call(out: str, run: Path) -> None:
    assert re.search(
        r"^gflowdist: replacing rank 1 \(actor on \S+\) \(lost: no heartbeat .*\): spare actor 1 of 1, started "
        r"with MPI_Comm_spawn, takes its place$",
        out,
        re.M,
    ), out
    assert re.search(
        r"^gflowdist: lost rank 1 \(actor on \S+\): its replacement sent no heartbeat within "
        r"faults.startup_timeout_s \(20 s; its log: logs/rank-1.log\); going on without it",
        out,
        re.M,
    ), out
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["1"], ledger
    assert "went on without rank 1" in ledger["final_line"]
