"""`gflowdist report RUN_DIR`: on the run directory of a real HyperGrid run, and on hand-made
broken ones.

The real run is the README's main command, ``gflowdist run examples/hypergrid/config.yaml``
(40 steps, 4 ranks, with ``run.tensorboard=true`` and ``run.trace=true``), once per module, on the
``local`` engine (its ranks as threads of this process, tests/support/local_jobs.py: the report, the
figure and the event files are the collector's, whatever the engine).
Besides the report, its run directory is checked for ``report.png``, the TensorBoard event
files, and a timeline drawn from its ``trace.json``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gflowdist.cli import main
from gflowdist.timing import Report
from tests.support.jobs import HYPERGRID
from tests.support.launching import REPO, base_env, kill_session
from tests.support.local_jobs import LocalJob


def gflowdist(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m gflowdist ARGS`` in its own session, killed (group) after 60 s."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gflowdist", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or base_env(),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        kill_session(proc)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of ``gflowdist run examples/hypergrid/config.yaml`` (40 steps) on the local engine."""
    job = LocalJob(
        tmp_path_factory.mktemp("job"),
        "run.steps=40",
        "run.log_every=10",
        "run.tensorboard=true",
        "run.trace=true",
        "report.figure=true",  # the suite skips it by default (tests/conftest.py)
        config=HYPERGRID,
    )
    assert job.returncode == 0, job.output
    run = job.run_dir()
    (run / "launcher.out").write_text(job.output)
    return run


@pytest.fixture
def copy_of_run(run_dir: Path, tmp_path: Path) -> Path:
    """A copy of the real run directory's report and ledger, to break by hand."""
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("report.json", "ledger.json", "report.txt"):
        shutil.copy(run_dir / name, copy / name)
    return copy


def _printed_done_line(run_dir: Path) -> str:
    lines = (run_dir / "launcher.out").read_text().splitlines()
    return next(line for line in reversed(lines) if line.startswith("gflowdist: done"))


def test_text_report_of_a_real_run(run_dir: Path) -> None:
    done = gflowdist("report", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    saved = (run_dir / "report.txt").read_text()
    assert done.stdout.startswith(saved)  # the report rebuilt from JSON = the one the run wrote
    assert "Load imbalance per role and phase" in done.stdout
    assert "[trainer] ranks 0-1" in done.stdout
    *_, verdict, last = done.stdout.rstrip("\n").splitlines()
    totals = json.loads((run_dir / "ledger.json").read_text())["totals"]
    assert verdict == (
        f"ledger: balanced -- {totals['produced']} produced = "
        f"{totals['used_locally']} used locally + {totals['received']} received + "
        f"{totals['in_flight']} in flight; {totals['admitted']} admitted, "
        f"{totals['dropped']} dropped"
    )
    assert last == _printed_done_line(run_dir)  # the same words as the run's own last line


def test_json_report_of_a_real_run(run_dir: Path) -> None:
    done = gflowdist("report", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert set(data) == {"run_dir", "report", "ledger", "final_line"}
    assert data["ledger"] == json.loads((run_dir / "ledger.json").read_text())
    assert data["report"] == json.loads((run_dir / "report.json").read_text())
    assert Report.from_dict(data["report"]).to_text() + "\n" == (run_dir / "report.txt").read_text()
    assert data["final_line"] == _printed_done_line(run_dir)


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_the_main_job_leaves_a_figure_and_tensorboard_files_of_every_metric(run_dir: Path) -> None:
    assert (run_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    finals = json.loads((run_dir / "finals.json").read_text())
    for rank in ("0", "1"):  # the trainers: every metric row, every timing iteration
        scalars = _scalars(run_dir / "tensorboard" / f"rank-{rank}")
        mine = [row for row in rows if row["rank"] == int(rank)]
        for name in ("loss", "l1", "log_z", "trajectories"):
            assert scalars[f"metrics/{name}"] == [(row["step"], pytest.approx(row[name])) for row in mine]
        rollout = finals[rank]["timing"]["phases"]["rollout"]
        assert scalars["timing/rollout"] == [(i, pytest.approx(s)) for i, s in enumerate(rollout)]
    buffer = _scalars(run_dir / "tensorboard" / "rank-2")
    assert len(buffer["timing/insert"]) == len(finals["2"]["timing"]["phases"]["insert"]) > 0
    mean = _scalars(run_dir / "tensorboard" / "mean")
    curve = json.loads((run_dir / "report.json").read_text())["curves"]["l1"]
    assert mean["metrics/l1"] == [(x, pytest.approx(y)) for x, y in zip(curve["x"], curve["y"], strict=False)]
    both = [finals[r]["timing"]["phases"]["loss"] for r in ("0", "1")]
    assert [v for _, v in mean["timing/trainer/loss"]][:2] == [
        pytest.approx((both[0][i] + both[1][i]) / 2) for i in range(2)
    ]


def test_report_writes_the_tensorboard_files_of_a_finished_run_again(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("tensorboard", "checkpoints", "logs"))
    code, _, err = run_report(capsys, str(copy), "--tensorboard")
    assert code == 0, err
    assert f"TensorBoard event files in {copy / 'tensorboard'}" in err
    for folder in ("rank-0", "rank-3", "mean"):
        assert _scalars(copy / "tensorboard" / folder) == _scalars(run_dir / "tensorboard" / folder)


def test_missing_directory_is_one_line_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-run"
    done = gflowdist("report", str(missing))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and str(missing) in done.stderr
    assert "Traceback" not in done.stderr


def run_report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("report.json", None, "report.json: not found"),
        ("ledger.json", None, "ledger.json: not found"),
        ("report.json", '{"format": 1, "ranks": [0', "report.json: not valid JSON"),
        ("report.json", "[1, 2]", "report.json: malformed: expected a JSON object, found list"),
        ("report.json", '{"format": 99}', "report.json: report format 99 is not supported"),
        ("report.json", '{"format": 1, "ranks": [0]}', "report.json: report data is malformed"),
        ("ledger.json", '{"totals": {}}', "ledger.json: malformed: expected an object with a boolean"),
        (
            "ledger.json",
            '{"balanced": true, "totals": {"produced": 1}}',
            "ledger.json: malformed: 'totals' lacks integer used_locally, received, admitted, dropped",
        ),
        ("ledger.json", '{"balanced": false}', "ledger.json: malformed: an unbalanced ledger must"),
    ],
)
def test_broken_run_directory_is_one_line_exit_2(
    capsys, copy_of_run: Path, name: str, content: str | None, words: str
) -> None:
    path = copy_of_run / name
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    code, out, err = run_report(capsys, str(copy_of_run))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("gflowdist report: error: ")
    assert str(path) in err and words in err


def test_unbalanced_ledger_prints_the_report_and_exits_1(capsys, copy_of_run: Path) -> None:
    error = "the ledger does not balance: rank 0 produced 9 but 0 were used locally, 8 reached a buffer"
    (copy_of_run / "ledger.json").write_text(json.dumps({"balanced": False, "error": error}))
    code, out, err = run_report(capsys, str(copy_of_run))
    assert code == 1 and err == ""
    *_, verdict, last = out.rstrip("\n").splitlines()
    assert verdict == f"ledger: NOT balanced -- {error}"
    assert last == f"gflowdist: failed: {error}; run directory {copy_of_run}"


def test_a_stored_final_line_is_printed_as_is(capsys, copy_of_run: Path) -> None:
    ledger = json.loads((copy_of_run / "ledger.json").read_text())
    ledger["final_line"] = "gflowdist: done (all modes found): 5 trajectories produced"
    (copy_of_run / "ledger.json").write_text(json.dumps(ledger))
    code, out, _ = run_report(capsys, str(copy_of_run), "--json")
    assert code == 0 and json.loads(out)["final_line"] == ledger["final_line"]


def test_png_without_matplotlib_is_one_line_exit_1(capsys, monkeypatch, copy_of_run: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    target = copy_of_run / "figure.png"
    code, out, err = run_report(capsys, str(copy_of_run), "--png", str(target))
    assert code == 1 and out == ""
    assert err == (
        "gflowdist report: --png needs matplotlib, a dependency of gflowdist, which does not "
        "import: pip install 'matplotlib>=3.6'\n"
    )
    assert not target.exists()


def test_png_with_matplotlib(capsys, copy_of_run: Path) -> None:
    pytest.importorskip("matplotlib")
    target = copy_of_run / "figure.png"
    code, out, err = run_report(capsys, str(copy_of_run), "--png", str(target))
    assert code == 0 and "Load imbalance" in out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(target) in err


def test_timeline_of_a_real_run_and_without_a_trace(capsys, run_dir: Path, copy_of_run: Path) -> None:
    shutil.copy(run_dir / "trace.json", copy_of_run / "trace.json")
    target = copy_of_run / "timeline.png"
    code, out, err = run_report(capsys, str(copy_of_run), "--timeline", str(target), "--window", "0:80")
    assert code == 0 and "Load imbalance" in out and str(target) in err
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target.unlink()
    code, out, err = run_report(capsys, str(copy_of_run), "--timeline", str(target), "--window", "99999:100100")
    assert code == 2 and out == "" and not target.exists(), err  # refused before anything is printed
    assert (
        len(err.strip().splitlines()) == 1
        and "the window 99999:100100 ms is outside the trace, which spans 0.0 to " in err
        and err.rstrip().endswith(" ms")
    ), err
    (copy_of_run / "trace.json").unlink()
    code, out, err = run_report(capsys, str(copy_of_run), "--timeline", str(target))
    assert (
        code == 1
        and out == ""
        and "trace.json not found: the run had run.trace=false (tracing is on by default)" in err
    )
