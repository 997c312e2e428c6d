"""Nothing lost under load (promise 2): the ledger balances exactly, over several seeds.

The toy job on 4 ranks (trainer 0, actor 1, buffer 2, coordinator 3) with a
random sleep of up to ``params.delay_s`` in every trainer and actor rollout
and every admission on the buffer (tests/jobs/toy_roles.py), tiny batches
(``params.n = 2``), at most 2 unacknowledged sends per client
(``replay.max_in_flight``) and 2 replay batches requested ahead
(``replay.prefetch``). The free-running actor floods the buffer, whose
admissions are slow, so sends wait for flow control and the trainer's sample
replies queue behind the actor's data: thousands of small messages in flight
with timings that differ from seed to seed (``run.seed`` seeds every rank's
delays).

Seed 0 runs under mpiexec (real processes, real MPI queues), started by the
module fixture and left running while seeds 1-4 run on the ``local`` engine
(ranks as threads of the test's process, the same protocol, loops and ledger:
tests/support/local_jobs.py), one after the other: the machine is loaded on
purpose, and the whole file costs about one mpiexec run instead of five.

Each run's accounting is re-derived here from finals.json, not only read from
the runtime's own verdict: every trajectory a producer made reached the
buffer, every one the buffer received was admitted or dropped for a named
reason, and the buffer's storage agrees with its ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.jobs import Job, layout_rows, read_json
from tests.support.local_jobs import LocalJob

SEEDS = [0, 1, 2, 3, 4]
#: the seeds whose job runs under mpiexec; the others run on the local engine
MPI_SEEDS = [0]
STEPS = 80
N = 2
CAPACITY = 1000  # replay.capacity of tests/jobs/toy.yaml
ARGS = [
    "-n",
    "4",
    "layout.actors=1",
    f"run.steps={STEPS}",
    f"params.n={N}",
    "params.delay_s=0.01",
    "replay.max_in_flight=2",
    "replay.prefetch=2",
    "replay.replay_fraction=0.5",
    # liveness is not under test here: generous limits for a deliberately loaded machine
    "faults.peer_timeout_s=30",
    "faults.preempt_grace_s=40",
    "faults.heartbeat_s=0.5",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Job | LocalJob]:
    jobs: dict[int, Job | LocalJob] = {}
    try:
        for seed in MPI_SEEDS:  # started first, running while the local ones run
            jobs[seed] = Job(tmp_path_factory.mktemp(f"seed{seed}"), *ARGS, f"run.seed={seed}")
        for seed in SEEDS:
            if seed not in MPI_SEEDS:
                jobs[seed] = LocalJob(tmp_path_factory.mktemp(f"seed{seed}"), *ARGS, f"run.seed={seed}")
        yield jobs
    finally:
        for job in jobs.values():
            if isinstance(job, Job):
                job.kill()
                job.log.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_ledger_balances_exactly_under_random_delays(runs, seed):
    job = runs[seed]
    assert job.wait(240) == 0, job.output
    run: Path = job.run_dir()
    rows = layout_rows(run)
    roles = {r: row["role"] for r, row in rows.items()}
    assert roles == {0: "trainer", 1: "actor", 2: "buffer", 3: "coordinator"}
    finals = read_json(run / "finals.json")
    ledgers = {int(r): f["ledger"] for r, f in finals.items()}
    buffer = ledgers[2]

    assert ledgers[0]["produced"] == STEPS * N  # one batch of n per trainer step
    assert ledgers[1]["produced"] > 0 and finals["1"]["summary"]["weight_updates"] > 0
    for producer in (0, 1):  # every trajectory made reached the buffer: none lost, none left in flight
        mine = ledgers[producer]
        assert mine["in_flight"] == 0 and mine["used_locally"] == 0
        assert mine["sent"] == mine["produced"] == buffer["received_from"][str(producer)], (producer, mine)
    assert buffer["received"] == ledgers[0]["produced"] + ledgers[1]["produced"]
    assert buffer["received"] == buffer["admitted"] + sum(buffer["dropped"].values())
    assert buffer["malformed"] == {}
    replay = finals["2"]["replay"]
    assert replay["admitted"] == buffer["admitted"]
    assert replay["size"] == min(CAPACITY, buffer["admitted"])
    assert buffer["evicted"] == buffer["admitted"] - replay["size"]
    assert replay["sampled"] > 0

    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    assert ledger["totals"]["produced"] == buffer["received"] and ledger["totals"]["in_flight"] == 0
    assert ledger["final_line"] in job.output
    assert job.no_process_left()
