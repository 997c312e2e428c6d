"""The run's end on one screen, and a resumed run keeping every generation's report and trace.

What the collector prints and writes is the same whatever the engine: those jobs run on the ``local``
engine (ranks as threads of this process, tests/support/local_jobs.py). The README's main job in a
terminal, and Ctrl-C to a launcher with the run it resumes (a run resumes on the engine it ran on), run
under mpiexec."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from gflowdist.runtime.history import keep_earlier, read_history, record_generation
from gflowdist.timing import build_report
from gflowdist.timing.headline import headline, idle_phase, rank_times
from tests.support.jobs import read_json


def _timer(phases: dict[str, list[float]], waits: dict[str, dict[str, float]] | None = None) -> dict:
    return {"format": 1, "phases": phases, "waits": waits or {}, "wait_counts": {}}


def _report(**kw):
    return build_report(
        {
            0: _timer({"rollout": [1.0, 1.0], "loss": [2.0, 2.0]}, {"1": {"sample": 1.0}}),
            1: _timer({"idle": [5.0], "insert": [0.5], "sample": [0.5]}),
            2: _timer({"idle": [6.0], "collect": [0.1]}),
        },
        roles={0: "trainer", 1: "buffer", 2: "coordinator"},
        metrics=[{"step": 0, "loss": 4.0, "trajectories": 8}, {"step": 9, "loss": 0.5, "trajectories": 80}],
        **kw,
    )


def test_idle_phases_are_idle_and_blocked_seconds_are_not_busy():
    assert idle_phase("idle") and idle_phase("wait_replay") and not idle_phase("sync")
    busy, idle = rank_times(_report())[0]
    assert abs(sum(busy.values()) - 5.0) < 1e-9 and abs(idle - 1.0) < 1e-9  # 6 s of phases, 1 s blocked on rank 1


def test_the_headline_names_rate_busiest_and_most_waiting_rank_verdict_metrics_and_files(tmp_path):
    for name in ("report.txt", "report.png", "trace.json"):
        (tmp_path / name).write_text("x")
    lines = headline(_report(), verdict="ledger: balanced -- ...", run_dir=tmp_path, seconds=10.0, made=800)
    text = "\n".join(lines)
    assert lines[0] == "10.0 s, 80 trajectories/s"
    assert "busiest: rank 0 trainer, busy 83% of its time (loss 3.3 s, rollout 1.7 s)" in text
    assert "most waiting: rank 0 trainer, blocked 1.0 s (1.0 s on rank 1 buffer)" in text
    assert "ledger: balanced -- ..." in lines
    assert "loss 4 -> 0.5" in text and "trajectories" not in text.split("report")[0].split("/s")[1]
    assert f"report {tmp_path / 'report.txt'}" in text and f"gflowdist report {tmp_path}" in text
    assert f"figure {tmp_path / 'report.png'}" in text and f"trace  {tmp_path / 'trace.json'}" in text
    assert len(lines) <= 10


def test_files_that_were_not_written_are_not_named(tmp_path):
    (tmp_path / "report.txt").write_text("x")
    text = "\n".join(headline(_report(), verdict="ledger: ok", run_dir=tmp_path))
    assert "report.png" not in text and "trace.json" not in text and "report.txt" in text


def test_an_earlier_generations_files_are_kept_under_its_number(tmp_path):
    for name in ("report.txt", "report.png", "trace.json"):
        (tmp_path / name).write_text(name)
    (tmp_path / "report.json").write_text(json.dumps({"generation": 0}))
    record_generation(tmp_path, {"generation": 0, "report": "report.txt"})
    assert keep_earlier(tmp_path) == {
        "report.txt": "report.gen0.txt",
        "report.json": "report.gen0.json",
        "report.png": "report.gen0.png",
        "trace.json": "trace.gen0.json",
    }
    assert (tmp_path / "trace.gen0.json").read_text() == "trace.json" and not (tmp_path / "report.txt").exists()
    assert read_history(tmp_path)[0]["report"] == "report.gen0.txt"
    # a second attempt at the same generation (the first failed) is kept beside the first
    (tmp_path / "report.txt").write_text("again")
    (tmp_path / "report.json").write_text(json.dumps({"generation": 0}))
    assert keep_earlier(tmp_path)["report.txt"] == "report.gen0-1.txt"
    assert keep_earlier(tmp_path) == {}


def test_the_report_of_a_resumed_run_shows_every_generation():
    import dataclasses

    from gflowdist.timing import Report

    entries = (
        {
            "generation": 0,
            "steps": [0, 15],
            "seconds": 2.0,
            "made": 240,
            "unit": "trajectories",
            "ended": "signal SIGINT",
            "report": "report.gen0.txt",
        },
        {
            "generation": 1,
            "steps": [15, 30],
            "seconds": 3.0,
            "made": 240,
            "unit": "trajectories",
            "ended": "done",
            "report": "report.txt",
        },
    )
    report = dataclasses.replace(_report(), generation=1, generations=entries)
    text = Report.from_json(report.to_json()).to_text()
    assert text.startswith("gflowdist run report -- generation 1")
    table = text.split("Generations (the whole run)")[1].split("\n\n")[0]
    assert "15-30" in table and "80 trajectories/s" in table and "signal SIGINT" in table
    assert "report.gen0.txt" in table


def _end(output: str) -> list[str]:
    """The lines after the progress line's last one."""
    lines = output.splitlines()
    last_progress = max(i for i, line in enumerate(lines) if line.startswith("step "))
    return lines[last_progress + 1 :]


def test_a_run_ends_on_one_screen_and_keeps_the_whole_report_in_its_file(local_job_factory):
    job = local_job_factory("report.figure=true")  # the suite skips the figure unless asked (tests/conftest.py)
    assert job.wait(120) == 0, job.output
    run = job.run_dir()
    end = _end(job.output)
    assert len(end) <= 12, job.output
    assert "Load imbalance" not in job.output and "Load imbalance" in (run / "report.txt").read_text()
    text = "\n".join(end)
    for needed in (
        "trajectories/s",
        "busiest: rank",
        "most waiting: rank",
        "gflowdist: ledger: balanced",
        "loss ",
        str(run / "report.txt"),
        str(run / "report.png"),
        str(run / "trace.json"),
    ):
        assert needed in text, (needed, job.output)
    assert end[-1].startswith("gflowdist: done: 480 trajectories produced")
    assert len(job.output.splitlines()) <= 24, job.output  # the whole console: one screen
    assert job.no_process_left()


def test_ctrl_c_ends_with_the_resume_command_and_the_resumed_run_keeps_both_generations(job_factory):
    first = job_factory("run.steps=100000", "params.delay_s=0.01", "report.figure=true")
    run = first.wait_for_metrics(6)
    first.proc.send_signal(signal.SIGINT)
    assert first.wait(60) == 130, first.output
    assert first.output.strip().splitlines()[-1] == (
        f"gflowdist: stopped by SIGINT; resume with: gflowdist run --resume {run}"
    ), first.output
    produced_before = read_json(run / "ledger.json")["totals"]["produced"]
    reached = max(read_json(run / "checkpoints" / "gen-0000-final" / "MANIFEST.json")["steps"].values())
    second = job_factory(f"run.steps={reached + 10}", "params.delay_s=0", "report.figure=true", "--resume", str(run))
    second.out_dir = run.parent
    assert second.wait(120) == 0, second.output
    for kept in ("report.gen0.txt", "report.gen0.json", "report.gen0.png", "trace.gen0.json"):
        assert (run / kept).exists(), kept
    assert "stopped by SIGINT" not in (run / "report.txt").read_text()
    history = read_history(run)
    assert [e["generation"] for e in history] == [0, 1]
    assert history[0]["ended"] == "signal SIGINT" and history[0]["report"] == "report.gen0.txt"
    # the rate of the resumed generation counts what it made, not everything since the run began
    produced = read_json(run / "ledger.json")["totals"]["produced"]
    assert history[1]["made"] == produced - produced_before == 10 * 8 * 2
    assert history[1]["steps"] == [reached, reached + 10]
    text = (run / "report.txt").read_text()
    assert "Generations (the whole run)" in text and "report.gen0.txt" in text
    assert "gen 1" in second.output
    assert second.no_process_left()


def test_generations_json_survives_an_unwritable_history(tmp_path: Path, caplog):
    (tmp_path / "generations.json").mkdir()  # a folder where the file should be: the write fails, logged
    entries = record_generation(tmp_path, {"generation": 0})
    assert entries == [{"generation": 0}] and "cannot write" in caplog.text


def test_an_rl_run_says_why_it_stopped_and_counts_transitions(local_job_factory):
    pytest.importorskip("gymnasium")
    from tests.test_example_apex_cartpole import EXAMPLE, SMALL

    job = local_job_factory(*SMALL, "params.target_return=1", config=EXAMPLE / "config.yaml")
    assert job.wait(150) == 0, job.output
    final = job.output.strip().splitlines()[-1]
    assert final.startswith("gflowdist: done (eval_return ") and " >= 1): " in final, job.output
    assert "transitions produced" in final and "transitions/s" in job.output
    assert "the coordinator decided to stop" not in job.output


def _in_a_terminal(cmd: list[str], act=None, timeout: float = 240) -> tuple[int, str]:
    """Run ``cmd`` with a terminal (a pty) as its stdin, stdout and stderr; ``act(output so far)`` after each
    read until it returns True. Its exit status and everything it wrote."""
    import os
    import pty
    import select
    import subprocess
    import time

    from tests.support.launching import base_env, kill_session

    main, child = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, env=base_env(), start_new_session=True)
    os.close(child)
    chunks: list[bytes] = []
    deadline, acting = time.monotonic() + timeout, act is not None
    try:
        while time.monotonic() < deadline:
            if select.select([main], [], [], 0.2)[0]:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the terminal closed: every process that held it ended
                    break
                if not data:
                    break
                chunks.append(data)
            if acting and act(b"".join(chunks)):
                acting = False
        code = proc.wait(60)
    finally:
        kill_session(proc)
        os.close(main)
    return code, b"".join(chunks).decode(errors="replace")


def test_in_a_terminal_the_readmes_main_job_ends_on_one_screen_its_progress_line_rewritten_in_place(tmp_path):
    """Under mpiexec a rank's stdout is a pipe; the launcher tells the ranks its own stdout is a terminal.
    The README's main job (`gflowdist run examples/hypergrid/config.yaml`), as a person sees it."""
    import sys

    from tests.support.jobs import HYPERGRID

    cmd = [sys.executable, "-m", "gflowdist", "run", str(HYPERGRID), f"run.out_dir={tmp_path / 'runs'}"]
    code, text = _in_a_terminal(cmd)
    assert code == 0, text
    assert text.count("\r\x1b[2K") >= 2, text  # at least two updates of the one line
    lines = text.replace("\r\n", "\n").split("\n")
    assert sum(1 for line in lines if line.startswith("step ")) == 0, text  # no progress line of its own
    assert sum(1 for line in lines if "\x1b[2Kstep " in line) == 1, text  # all its updates on one line
    assert "gflowdist: done: 19200 trajectories produced" in text
    assert len(lines) <= 24, text  # one screen, the progress line's updates counted once


def test_actors_that_flood_the_learners_are_warned_on_the_progress_line_the_end_and_the_report(local_job_factory):
    """A plain Actor, unpaced, beside a slow trainer: nothing said so (43,616 of 44,320 in 21 steps)."""
    job = local_job_factory("layout.trainers=1", "layout.actors=2", "-n", "5", "params.slow_s=0.05", "run.steps=60")
    assert job.wait(120) == 0, job.output
    progress = [line for line in job.output.splitlines() if line.startswith("step ")]
    assert "flooding " in progress[-1] and "(pace with replay.samples_per_insert)" in progress[-1], job.output
    warning = next(line for line in job.output.splitlines() if "actors flooded the learners" in line)
    assert "trajectories admitted per learner step, 8 replayed per step" in warning
    assert warning.endswith("pace them with replay.samples_per_insert (the rate limiter), or rollout() returning None")
    assert "actors flooded the learners" in (job.run_dir() / "report.txt").read_text()
    assert job.no_process_left()


def test_a_run_whose_trainers_learn_what_they_make_is_not_flooding(local_job_factory):
    job = local_job_factory("run.steps=20")
    assert job.wait(120) == 0, job.output
    assert "flood" not in job.output and "flood" not in (job.run_dir() / "report.txt").read_text()


def test_in_a_terminal_the_lines_said_beside_the_progress_line_start_on_lines_of_their_own(tmp_path):
    """The collector's progress line is rewritten in place in a terminal, so it is open between updates. Its
    actor killed (``faults.on_actor_loss: continue``), the collector's "going on without it" was glued to it
    (``... modesgflowdist: lost rank 2 ...``); then a trainer killed, the launcher's failure lines were too
    (``... modes 4/4gflowdist: the job failed``): both now start lines of their own."""
    import os
    import re
    import sys

    from tests.support.jobs import HYPERGRID, pid_of_rank

    runs = tmp_path / "runs"
    faults = ["faults.peer_timeout_s=3", "faults.heartbeat_s=0.2", "faults.on_actor_loss=continue"]
    cmd = [sys.executable, "-m", "gflowdist", "run", str(HYPERGRID), "-n", "5", "layout.actors=1", "run.steps=100000"]
    cmd += [f"run.out_dir={runs}", *faults]
    killed: list[int] = []

    def kill_the_actor_then_a_trainer_each_while_the_line_is_open(output: bytes) -> bool:
        # the line is open once rewritten (twice: not the first update), after the last loss's line if any
        if output.rsplit(b"going on without it", 1)[-1].count(b"\x1b[2Kstep ") < 2:
            return False
        (run,) = runs.iterdir()
        victim = 2 if not killed else 1  # the actor (ranks: trainers 0-1, actor 2, buffer 3, coordinator 4)
        if victim == 1 and b"going on without it" not in output:
            return False
        os.kill(pid_of_rank(run, victim), signal.SIGKILL)
        killed.append(victim)
        return victim == 1

    code, text = _in_a_terminal(cmd, kill_the_actor_then_a_trainer_each_while_the_line_is_open, timeout=180)
    assert killed == [2, 1] and code != 0, text
    text = text.replace("\r\n", "\n")
    assert re.search(r"\ngflowdist: lost rank 2 \(actor on .*; going on without it", text), text
    assert re.search(r"\ngflowdist: the job failed \(exit \d+\):\ngflowdist: lost rank 1 \(trainer on ", text), text
    assert not re.search(r"[^\n]gflowdist: ", text), text  # every line said beside the progress starts a line
