"""A failed run's post-mortem, through the real CLI (issue 23 item 1).

Two toy jobs (trainers 0-1, buffer 2, coordinator 3), the first on the ``local`` engine (ranks as threads
of this process, tests/support/local_jobs.py: the same protocol gathers the same post-mortem), run while
the second runs under mpiexec (a rank killed with ``kill -9`` is a real process's death):

- a trainer's ``loss()`` raises at step 30 (periodic checkpoints every 10 steps):
  the console shows the failure once, in the user's terms (the user's frames,
  the rank's log, no framework traceback, no MPI_Abort lines) and the command
  that resumes the run; the run directory holds failure.json, a partial
  report.txt/json/png with the failure at the top and trace.json with every
  rank's timeline up to the failure; ``gflowdist report RUN`` reads it;
- the buffer is killed with ``kill -9``: the lost rank is named at the top of
  the partial report, with what the surviving ranks held.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests.support.jobs import pid_of_rank, read_json
from tests.support.launching import base_env

FAST = ("faults.heartbeat_s=0.2", "faults.peer_timeout_s=4")


def test_a_failed_run_leaves_a_partial_report_and_trace_that_gflowdist_report_reads(job_factory, local_job_factory):
    lost = job_factory("run.steps=100000", "params.delay_s=0.01", *FAST)
    raises = local_job_factory(
        "run.steps=100",
        "params.loss_fail_rank=1",
        "params.loss_fail_at=30",
        "faults.checkpoint_every=10",
        "report.figure=true",  # a failed run draws it too (the suite skips it unless asked: tests/conftest.py)
        *FAST,
    )
    run = lost.wait_for_metrics(4)
    os.kill(pid_of_rank(run, 2), signal.SIGKILL)
    codes = raises.wait(150), lost.wait(150)
    _check_loss_raised(raises, codes[0])
    _check_rank_lost(lost, codes[1])


def _check_loss_raised(job, code: int) -> None:
    out, run = job.output, job.run_dir()
    assert code == 1, out
    # once, in the user's terms: the headline, the user's frames, the log; no framework traceback, no MPI noise
    headline = r"gflowdist: rank 1 \(trainer on \S+\) failed at step 30: RuntimeError: toy loss failure on purpose"
    assert len(re.findall(headline, out)) == 1 and out.count("toy loss failure on purpose") == 2, out  # and its line
    assert "Traceback" not in out and "MPI_Abort" not in out and "runtime/job.py" not in out, out
    assert re.search(r'in your code \(most recent call last\):\n    File "\S+toy_roles.py", line \d+, in loss\n', out)
    assert 'raise RuntimeError("toy loss failure on purpose")' in out
    assert re.search(r"called by gflowdist: runtime/loops/\w+\.py:\d+ in ", out), out
    log = run / "logs" / "rank-1.log"
    assert f"the whole traceback: {log}" in out and "Traceback (most recent call last)" in log.read_text()
    assert f"gflowdist: partial report: {run / 'report.txt'}, {run / 'trace.json'}" in out
    assert f"gflowdist: to resume: gflowdist run --resume {run}" in out
    # the report: partial, the failure at the top with the user's frame and the resume command
    report = (run / "report.txt").read_text()
    assert report.startswith("gflowdist run report -- PARTIAL: the run failed\n"), report[:300]
    top = report.split("\n\n", 1)[0]
    assert re.search(r"failure: rank 1 \(trainer on \S+\) failed at step 30: RuntimeError: toy loss", top), top
    assert re.search(r"in your code: toy_roles.py:\d+ in loss", top) and f"resume: gflowdist run --resume {run}" in top
    assert "[trainer] ranks 0-1" in report and "[buffer]" in report  # every rank's timers made it
    assert read_json(run / "report.json")["partial"] and (run / "report.png").stat().st_size > 0
    failure = read_json(run / "failure.json")
    assert {r: part["part"] for r, part in failure["ranks"].items()} == {
        "0": "held",
        "1": "held",
        "2": "held",
        "3": "held",
    }
    assert failure["failures"][0]["frame"].startswith("toy_roles.py:") and failure["failures"][0]["step"] == 30
    _check_trace(run)
    ledger = read_json(run / "ledger.json")
    assert ledger["partial"] and not ledger["balanced"] and "failed at step 30" in ledger["final_line"]
    # gflowdist report reads the failed run: the failure first, the ledger not checked, the failure line last
    shown = subprocess.run(
        [sys.executable, "-m", "gflowdist", "report", str(run)],
        capture_output=True,
        text=True,
        env=base_env(),
        timeout=120,
    )
    assert shown.returncode == 1, shown.stderr
    lines = shown.stdout.strip().splitlines()
    assert lines[0] == "gflowdist run report -- PARTIAL: the run failed" and "failed at step 30" in lines[2]
    assert lines[-2].startswith("ledger: not checked -- the run failed")
    assert (
        lines[-1].startswith("gflowdist: FAILED: rank 1 (trainer on")
        and f"resume: gflowdist run --resume {run}" in lines[-1]
    )
    assert job.no_process_left()


def _check_trace(run) -> None:
    """trace.json: marked partial, every rank's track, the failure an instant on rank 1's, the seconds before it."""
    trace = read_json(run / "trace.json")
    assert trace["otherData"]["partial"] and "failed at step 30" in trace["otherData"]["failure"]
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}
    [failed] = [e for e in events if e["ph"] == "i" and e["name"] == "failure" and e["pid"] == 1]
    assert failed["args"]["step"] == 30 and failed["args"]["exception"] == "RuntimeError: toy loss failure on purpose"
    before = [e for e in spans if e["pid"] == 1 and e["ts"] + e["dur"] <= failed["ts"]]
    assert [e for e in before if e["name"] == "loss" and failed["ts"] - e["ts"] < 2e6], "no loss phase just before"
    survivor = [e for e in spans if e["pid"] == 0]
    assert max(e["ts"] + e["dur"] for e in survivor) > failed["ts"] - 2e6  # rank 0 ran up to the failure too


def _check_rank_lost(job, code: int) -> None:
    out, run = job.output, job.run_dir()
    assert code == 3, out
    assert len(re.findall(r"gflowdist: lost rank 2 \(buffer on \S+\)", out)) == 1, out
    assert "Traceback" not in out and "MPI_Abort" not in out, out
    report = (run / "report.txt").read_text()
    assert report.startswith("gflowdist run report -- PARTIAL: the run failed\n"), report[:300]
    assert re.search(r"failure: lost rank 2 \(buffer on \S+\)", report.split("\n\n", 1)[0]), report[:600]
    assert "resume: no complete checkpoint" in report
    failure = read_json(run / "failure.json")
    assert failure["ranks"]["2"]["part"] == "lost" and failure["failures"][0]["kind"] == "lost rank"
    assert all(failure["ranks"][r]["part"] == "held" for r in ("0", "1", "3")), failure["ranks"]
    trace = read_json(run / "trace.json")
    assert trace["otherData"]["partial"] and {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} >= {0, 1, 3}
    assert job.no_process_left()


def test_a_lost_rank_ends_the_job_with_status_3_whichever_rank_noticed_it():
    """Seen once in CI under load: the trainer's sample reply timed out before the collector missed the killed
    buffer's heartbeats, and the collector, relaying the trainer's failure, ended the job with 1, not 3."""
    from gflowdist.errors import PeerLostError
    from gflowdist.runtime.failures import Failure, RankFailed
    from gflowdist.runtime.postmortem import _exit_code

    def relayed(kind: str) -> RankFailed:
        return RankFailed(Failure(2, "buffer", "vm", None, kind, "PeerLostError: x", None, "text", "detail"), {}, 0)

    assert _exit_code(PeerLostError(2, role="buffer", host="vm", reason="no heartbeat")) == 3  # the collector's
    assert _exit_code(relayed("lost rank")) == 3  # another rank noticed, the collector ends the job
    assert _exit_code(relayed("exception")) == 1


def test_a_lost_rank_relayed_by_the_rank_that_noticed_it_files_each_part_under_its_own_rank(monkeypatch, tmp_path):
    """Seen once in CI under load: trainer 0 noticed the killed buffer (rank 2) first and relayed its failure; the
    collector filed trainer 0's part under rank 2 (failure.json: rank 2 a trainer, "held"), asked the dead buffer
    for its part, and reported trainer 0, which had answered already, as silent."""
    from types import SimpleNamespace

    from gflowdist.layout import Role
    from gflowdist.runtime import conclusion, protocol
    from gflowdist.runtime.failures import LOST_RANK, Failure, RankFailed
    from gflowdist.runtime.postmortem import _gather_and_write
    from gflowdist.transport.messages import Message

    roles = {0: Role.TRAINER, 1: Role.TRAINER, 2: Role.BUFFER, 3: Role.COORDINATOR}
    asked: list[int] = []  # asked for their parts
    told: list[int] = []  # told the post-mortem is written (those waiting for the end may go)
    msg_type, body = protocol.partial({"role": "trainer", "step": 15})
    inbox = [Message(msg_type, 1, 0, body)]  # trainer 1 answers the collector's question
    control = SimpleNamespace(
        isend=lambda _type, body, dst: (told if body.get("written") else asked).append(dst),
        try_recv=lambda *_source: inbox.pop() if inbox else None,
        drain=lambda timeout: None,
    )
    w = SimpleNamespace(
        rank=3,
        lost={},
        comm=SimpleNamespace(size=4),
        control=control,
        settings=SimpleNamespace(postmortem_wait_s=0.3, figure=False),
        generation=0,
        context=SimpleNamespace(role=Role.COORDINATOR),
        reports=SimpleNamespace(final_dict=lambda role, extras: {"role": role, **extras}),
    )
    collector = SimpleNamespace(
        w=w,
        finals={},
        layout=SimpleNamespace(role_of=roles.__getitem__, host_of=lambda _r: "vm"),
        lost_actors=SimpleNamespace(beats={}),
        latest={},
        generation_note=None,
        note_refused=lambda _problem: None,
        record_metrics=lambda *a, **k: None,
    )
    holding = SimpleNamespace(w=w, collector=collector, extras=lambda: {})
    process = SimpleNamespace(step=lambda: 0, run_dir=tmp_path)
    written: dict = {}
    monkeypatch.setattr(
        conclusion,
        "conclude_failed",
        lambda _dir, failures, states, **kw: written.update(states=states, missing=kw["missing"]) or "line",
    )
    failure = Failure(2, "buffer", "vm", None, LOST_RANK, "PeerLostError: no reply", None, "text", "detail")
    err = RankFailed(failure, {"role": "trainer", "step": 14}, sender=0)

    _gather_and_write(process, holding, failure, err)  # type: ignore[arg-type]

    states = written["states"]
    assert states[0] == {"role": "trainer", "step": 14}  # trainer 0's part, under its own rank
    assert states[1]["step"] == 15 and states[2]["role"] == "buffer" and states[2]["lost"] == "PeerLostError: no reply"
    assert written["missing"] == {}  # nobody reported silent
    assert asked == [1] and sorted(told) == [0, 1]  # neither the dead buffer nor the trainer that told us is asked
