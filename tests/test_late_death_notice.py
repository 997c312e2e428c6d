"""A notice of a death that comes after the death was named (``faults.on_actor_loss: continue``), in a real job.

MPICH's hydra signals every rank (SIGUSR1) when a process of the job ends; it may do so again after the
collector has named the dead rank (a killed rank's process, then its keeper). Each rank then stops sending
to the actors until a death is named (a send to a dead rank stalls MPICH's traffic), and before the notice
expired (:meth:`gflowdist.runtime.liveness.Liveness.death_unnamed`) nothing was left to name: the trainers
sent no weights to their actors until the run's end, and nothing said so. Here the test sends that late
notice itself, to every surviving rank, once the killed actor is named.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.jobs import pid_of_rank, read_json

EXPIRED = "hydra said a process of this job ended"


def _actor_versions(run: Path, rank: int) -> list[int]:
    """The policy version (``step``) of each metrics row ``rank`` (an actor) sent so far."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip().endswith("}")]
    return [row["step"] for row in rows if row["rank"] == rank]


def _wait(what: str, job, ready, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if job.proc.poll() is not None:
            raise AssertionError(f"job ended ({job.proc.returncode}) before {what}:\n{job.output}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s:\n{job.output}")
        time.sleep(0.1)


def test_a_late_notice_of_a_named_death_expires_and_the_trainers_send_weights_to_their_actors_again(job_factory):
    # trainers 0-1, actors 2-3 (one each), buffer 4, coordinator 5 (the collector)
    job = job_factory(
        "run.steps=100000",
        "run.log_every=1",
        "layout.actors=2",
        "-n",
        "6",
        "params.delay_s=0.02",
        "params.actor_metrics=1",
        "faults.on_actor_loss=continue",
        "faults.heartbeat_s=0.2",
        "faults.peer_timeout_s=3",
    )
    run = job.wait_for_metrics(2)
    _wait("metrics rows from actor 3", job, lambda: _actor_versions(run, 3))
    os.kill(pid_of_rank(run, 2), signal.SIGKILL)
    survivors = (0, 1, 3, 4, 5)

    def named_everywhere() -> bool:  # a notice before a rank heard the name would be about this death
        return all("going on without rank 2" in (run / "logs" / f"rank-{r}.log").read_text() for r in survivors)

    _wait("naming of the killed actor on every rank", job, named_everywhere)
    for rank in survivors:  # hydra's notice again, with nothing left to name
        os.kill(pid_of_rank(run, rank), signal.SIGUSR1)
    noticed = max(_actor_versions(run, 3))
    _wait("expired notice", job, lambda: EXPIRED in job.output, timeout=30)
    # trainer 1 sends its actor weights again: the actor acts with newer policy versions than at the notice
    _wait("newer weights at actor 3", job, lambda: max(_actor_versions(run, 3)) > noticed + 2, timeout=30)
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(90) == 130, job.output
    out = job.output
    assert out.count(EXPIRED) == 1, out  # said once, by the collector; the ranks' logs have it
    # the trainers and the actor read the notice at every step; a busy buffer looks at its control messages
    # only when idle (it may not have looked since the expiry), and expires its notice when it next does
    for rank in (0, 1, 3):
        assert EXPIRED in (run / "logs" / f"rank-{rank}.log").read_text(), rank
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"] and list(ledger["lost_ranks"]) == ["2"], ledger
    assert job.no_process_left()
