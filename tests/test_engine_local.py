"""The ``local`` engine: ranks as threads of one process (gflowdist.comm.threads, gflowdist.runtime.in_process).

The communicator's contract is checked with threads directly; whole jobs run through
:func:`run_in_process`, in this process, with the same toy job the mpiexec suite runs
(tests/jobs/toy.yaml), and once through the CLI's ``--engine local -n 4``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gflowdist.comm import ReduceOp
from gflowdist.comm.threads import JobAborted, ThreadWorld
from gflowdist.config import Config
from gflowdist.errors import DeadlineError
from gflowdist.runtime.in_process import run_in_process

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "jobs" / "toy.yaml"


def on_every_rank(size: int, body, timeout: float = 30.0) -> list:
    """``body(comm)`` on each rank of a fresh thread world; the results in rank order (errors re-raised)."""
    comms = ThreadWorld(size).comms()
    results: list = [None] * size
    errors: list = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = body(comms[rank])
        except BaseException as err:  # handed to the test's thread below
            errors[rank] = err

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"a rank did not finish within {timeout} s")
    for err in errors:
        if err is not None:
            raise err
    return results


def test_collectives_give_every_rank_the_same_answer():
    def body(comm):
        x = torch.full((3,), float(comm.rank + 1))
        total = comm.all_reduce(x.clone(), ReduceOp.SUM)
        mean = comm.all_reduce(x.clone(), ReduceOp.AVG)
        biggest = comm.all_reduce(np.array([comm.rank]), ReduceOp.MAX)
        gathered = comm.all_gather(torch.tensor([comm.rank]))
        b = torch.tensor([comm.rank * 10.0])
        comm.broadcast(b, src=2)
        on_root = comm.gather(torch.tensor([comm.rank]), dst=1)
        names = comm.all_gather_bytes(f"r{comm.rank}".encode() * (comm.rank + 1))
        comm.barrier()
        return total, mean, biggest, gathered, b, on_root, names

    results = on_every_rank(4, body)
    for rank, (total, mean, biggest, gathered, b, on_root, names) in enumerate(results):
        assert total.tolist() == [10.0] * 3 and mean.tolist() == [2.5] * 3
        assert biggest.tolist() == [3]
        assert [int(g) for g in gathered] == [0, 1, 2, 3]
        assert b.item() == 20.0
        assert (on_root is None) == (rank != 1)
        assert names == [b"r0", b"r1r1", b"r2r2r2", b"r3r3r3r3"]
    assert [int(g) for g in results[1][5]] == [0, 1, 2, 3]


def test_messages_are_copies_in_order_per_tag_and_sender():
    def body(comm):
        if comm.rank == 0:
            data = bytearray(b"first")
            comm.send(data, 1, tag=5)
            data[:] = b"XXXXX"  # the sender may reuse its buffer at once
            comm.send(b"second", 1, tag=5)
            comm.send(b"other tag", 1, tag=6, kind=1)
            return None
        got = [comm.recv(0, tag=5, timeout=10) for _ in range(2)]
        src, payload, kind = comm.recv_kind(None, tag=6, timeout=10)
        return [bytes(p.numpy()) for _, p in got], (src, bytes(payload.numpy()), kind)

    _, (ordered, other) = on_every_rank(2, body)
    assert ordered == [b"first", b"second"] and other == (0, b"other tag", 1)


def test_split_renumbers_and_keeps_groups_apart():
    def body(comm):
        sub = comm.split([[3, 1], [0]])
        if sub is None:
            return None
        total = sub.all_reduce(torch.tensor([float(comm.rank)]))
        return sub.rank, sub.size, sub.world_rank(0), total.item()

    results = on_every_rank(4, body)
    assert results[2] is None
    assert results[3] == (0, 2, 3, 4.0) and results[1] == (1, 2, 3, 4.0)
    assert results[0] == (0, 1, 0, 0.0)


def test_a_collective_names_the_ranks_that_did_not_come():
    def body(comm):
        if comm.rank == 1:
            return None
        with pytest.raises(DeadlineError, match=r"barrier: ranks \[1\] did not arrive within 0.2 s"):
            comm.barrier(timeout=0.2)
        return True

    assert on_every_rank(2, body)[0] is True


def test_abort_ends_every_rank_that_waits():
    def body(comm):
        if comm.rank == 0:
            with pytest.raises(JobAborted) as ended:
                comm.abort(7)
            return ended.value.code
        with pytest.raises(JobAborted) as ended:
            comm.recv(0, tag=1, timeout=20)  # never sent: the abort ends the wait
        return ended.value.code

    assert on_every_rank(3, body) == [7, 7, 7]


def toy_config(tmp_path: Path, *overrides: str) -> Config:
    return Config.from_yaml(str(TOY), overrides=[f"run.out_dir={tmp_path / 'runs'}", *overrides])


def only_run(tmp_path: Path) -> Path:
    (run,) = (tmp_path / "runs").iterdir()
    return run


def test_the_toy_job_runs_as_threads_with_the_mpiexec_jobs_results(tmp_path, capsys):
    # the same job and checks as tests/test_runtime_jobs.py::test_normal_run_balances_and_writes_the_run_directory
    assert run_in_process(toy_config(tmp_path), 4) == 0
    run = only_run(tmp_path)
    for name in ("config.yaml", "metrics.jsonl", "ledger.json", "report.txt", "logs/rank-3.log"):
        assert (run / name).exists(), name
    ledger = json.loads((run / "ledger.json").read_text())
    assert ledger["balanced"] and ledger["totals"]["produced"] == ledger["totals"]["admitted"] == 30 * 8 * 2
    finals = json.loads((run / "finals.json").read_text())
    assert finals["2"]["replay"]["admitted"] == 480 and finals["2"]["replay"]["sampled"] > 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [m["w_error"] for m in metrics if m["rank"] == 0]
    assert trained[-1] < trained[0] / 2
    # each rank's log holds its own lines only
    assert "rank 1 " in (run / "logs" / "rank-1.log").read_text()
    assert "rank 2 " not in (run / "logs" / "rank-1.log").read_text()
    assert "ledger balanced" in capsys.readouterr().out


def test_actors_as_threads_receive_weights(tmp_path):
    config = toy_config(tmp_path, "layout.trainers=1", "layout.actors=2", "run.steps=20")
    assert run_in_process(config, 5) == 0
    finals = json.loads((only_run(tmp_path) / "finals.json").read_text())
    actors = [f for f in finals.values() if f["role"] == "actor"]
    assert len(actors) == 2 and all(a["summary"]["weight_updates"] > 0 for a in actors)


def test_a_failing_rank_prints_one_traceback_and_ends_the_job(tmp_path, capfd):
    # both trainers fail at the same step: only the first to fail speaks
    code = run_in_process(toy_config(tmp_path, "params.fail_in_trainer=5", "run.steps=1000"), 4)
    err = capfd.readouterr().err
    assert code == 1
    assert err.count("failed at step 5: RuntimeError: toy trainer failure on purpose") == 1, err
    assert err.count("in your code (most recent call last)") == 1, err  # the user's frames, once
    assert 'tests/jobs/toy_roles.py", line' in err and "Traceback" not in err  # the whole one is in the log
    # the post-mortem, gathered as under mpiexec (tests/test_postmortem.py checks it whole), and where it is
    run = only_run(tmp_path)
    failure = json.loads((run / "failure.json").read_text())
    assert failure["failures"][0]["step"] == 5 and set(failure["ranks"]) == {"0", "1", "2", "3"}, failure
    assert (run / "report.txt").read_text().startswith("gflowdist run report -- PARTIAL: the run failed\n")
    assert f"gflowdist: partial report: {run / 'report.txt'}, {run / 'trace.json'}" in err, err


def test_stop_flags_set_from_the_launcher_stop_every_rank_cleanly(tmp_path, monkeypatch):
    worlds: list[ThreadWorld] = []
    made = ThreadWorld.__init__

    def remember(self, size):
        made(self, size)
        worlds.append(self)

    monkeypatch.setattr(ThreadWorld, "__init__", remember)
    config = toy_config(tmp_path, "run.steps=100000", "params.delay_s=0.01")
    stopper = threading.Timer(3.0, lambda: worlds[0].stop_all("signal SIGINT"))
    stopper.start()
    try:
        assert run_in_process(config, 4) == 0  # no signal reached this thread: a stop, not an interruption
    finally:
        stopper.cancel()
    run = only_run(tmp_path)
    assert json.loads((run / "ledger.json").read_text())["balanced"]
    assert (run / "checkpoints" / "gen-0000-final" / "MANIFEST.json").exists()


def test_the_cli_runs_a_layout_in_one_process(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", str(TOY), "--engine", "local", "-n", "4",
         f"run.out_dir={tmp_path / 'runs'}", "run.steps=10"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ledger balanced" in proc.stdout
    assert json.loads((only_run(tmp_path) / "ledger.json").read_text())["totals"]["produced"] == 10 * 8 * 2
