"""What ``gflowdist run --resume RUN_DIR`` refuses before it launches anything (gflowdist.cli.resuming).

In one process, without torch: a run directory made by hand (the toy job's
``config.yaml`` for 5 ranks, trainers ``rest`` = 3, and checkpoints whose
files are random bytes listed in their manifests with size and SHA-256:
the checks before launch do not load them). Each refusal is one line, exit
status 2; a resume that passes returns the run's rank count.
"""

from __future__ import annotations

import json
import os

import pytest

from gflowdist.cli import main, run_cmd
from gflowdist.cli.resuming import resumed_rank_count
from gflowdist.config import Config
from gflowdist.errors import ConfigError
from gflowdist.rundir import checkpoint_name, recorded_config, write_config
from tests.support.checkpoints import fake_checkpoint
from tests.support.jobs import TOY

RANKS, STEPS = 5, 20
FINAL, PERIODIC = checkpoint_name(0), checkpoint_name(0, 10)


def _checkpoint(run, name: str, steps: dict[int, int] | None = None) -> None:
    fake_checkpoint(run, name, RANKS, steps)


@pytest.fixture
def run(tmp_path):
    """A finished 5-rank run on MPI: trainers 0-2 at step 20, buffer 3, coordinator 4."""
    run = tmp_path / "toy-20260101-120000"
    run.mkdir()
    write_config(run, Config.from_yaml(TOY, overrides=[f"run.steps={STEPS}"]), RANKS, "mpi")
    _checkpoint(run, PERIODIC)
    _checkpoint(run, FINAL, {0: STEPS, 1: STEPS, 2: STEPS, 3: 0, 4: 0})
    return run


def _resume(run, *overrides: str, nprocs: int | None = None) -> int:
    """What `gflowdist run --resume RUN [overrides]` decides before launch (as run_cmd._load builds the config)."""
    config = recorded_config(run, list(overrides))
    return resumed_rank_count(str(run), config, nprocs_option=nprocs, overrides=list(overrides))


def _refusal(run, *overrides: str, nprocs: int | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        _resume(run, *overrides, nprocs=nprocs)
    text = str(caught.value)
    assert "\n" not in text and text.startswith("--resume: "), text
    return text


def _truncate(path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def test_no_intact_checkpoint_is_refused_before_launch_in_one_line_exit_2(run, monkeypatch, capsys):
    for name in (FINAL, PERIODIC):
        _truncate(run / "checkpoints" / name / "rank-00001.pt")

    def launched(*_args, **_kwargs):
        raise AssertionError("the ranks were launched")

    monkeypatch.setattr(run_cmd, "_check_before_launch", launched)
    assert main(["run", "--resume", str(run), "run.steps=30"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"no complete, intact checkpoint in {run / 'checkpoints'}: " in err, err
    for name in (FINAL, PERIODIC):
        assert f"{name}/rank-00001.pt: truncated: 100 bytes, the manifest says 1001" in err, err


def test_the_newest_few_are_named_and_the_rest_counted(run):
    for step in (2, 4, 6):
        _checkpoint(run, checkpoint_name(0, step))
    for path in (run / "checkpoints").glob("*/rank-00000.pt"):
        path.write_bytes(os.urandom(1000))  # same size, another digest
    text = _refusal(run, "run.steps=30")
    assert text.count("its SHA-256 is not the manifest's") == 3 and "and 2 older, none intact either" in text, text
    assert FINAL in text and checkpoint_name(0, 2) not in text


def test_a_run_without_a_checkpoint_is_refused(run):
    for folder in (run / "checkpoints").iterdir():
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    assert "no checkpoint in" in _refusal(run, "run.steps=30")
    (run / "checkpoints").rmdir()
    assert "the run ended before its first checkpoint" in _refusal(run, "run.steps=30")


def test_a_partial_checkpoint_is_passed_over_for_the_newest_complete_one(run):
    (run / "checkpoints" / FINAL / "MANIFEST.json").unlink()  # a save a kill interrupted
    assert _resume(run, "run.steps=30") == RANKS
    assert _resume(run, f"run.steps={STEPS}") == RANKS  # the periodic one (step 10) has steps left
    (run / "checkpoints" / PERIODIC / "MANIFEST.json").unlink()
    text = _refusal(run, "run.steps=30")
    assert f"{FINAL}: no MANIFEST.json, a partial checkpoint" in text and f"{PERIODIC}: no MANIFEST.json" in text


def test_a_finished_run_is_refused_unless_run_steps_is_raised(run):
    text = _refusal(run)
    assert text == (
        f"--resume: run.steps ({STEPS}) already reached by checkpoint {FINAL}: raise run.steps "
        f"(run.steps=N with N > {STEPS}) to continue"
    ), text
    assert f"already reached by checkpoint {FINAL} (step {STEPS})" in _refusal(run, "run.steps=15")
    assert _resume(run, f"run.steps={STEPS + 1}") == RANKS


def test_a_trainer_short_of_run_steps_leaves_steps_to_do(run):
    manifest_path = run / "checkpoints" / FINAL / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["steps"]["1"] = STEPS - 2  # stopped by a signal before the others
    manifest_path.write_text(json.dumps(manifest))
    assert _resume(run) == RANKS


def test_a_layout_override_that_gives_the_same_layout_is_accepted(run):
    assert _resume(run, "layout.trainers=3", "run.steps=30") == RANKS  # 'rest' gave 3
    assert _resume(run, "layout.trainers=3", "layout.buffers=rest", "run.steps=30") == RANKS


def test_a_layout_override_that_changes_the_layout_is_refused_naming_each_key(run):
    text = _refusal(run, "layout.trainers=2", "layout.actors=1", "run.steps=30")
    assert "layout.trainers = 2 (the run has 'rest', which gave 3); layout.actors = 1 (the run has 0)" in text
    assert "layout.trainers = 4 (the run has 'rest', which gave 3)" in _refusal(run, "layout.trainers=4")
    assert f"-n 4 (the run has {RANKS} ranks)" in _refusal(run, "run.steps=30", nprocs=4)


def test_an_engine_change_is_refused(run, monkeypatch, capsys):
    text = _refusal(run, "run.steps=30", "launch.engine=torch")  # what --engine torch adds
    assert "launch.engine = torch (the run ran on mpi)" in text, text
    monkeypatch.setattr(run_cmd, "_check_before_launch", lambda *_a, **_k: pytest.fail("launched"))
    assert main(["run", "--resume", str(run), "--engine", "torch", "run.steps=30"]) == 2
    assert "launch.engine = torch (the run ran on mpi)" in capsys.readouterr().err
    assert _resume(run, "run.steps=30", "launch.engine=mpi") == RANKS


def test_a_config_file_whose_engine_launches_mpi_cannot_resume_a_torch_run(run):
    write_config(run, Config.from_yaml(TOY, overrides=[f"run.steps={STEPS}"]), RANKS, "torch")
    config = Config.from_yaml(TOY, overrides=["run.steps=30"])  # `gflowdist run toy.yaml --resume RUN`
    with pytest.raises(ConfigError, match=r"launch.engine = auto \(runs on mpi; the run ran on torch\)"):
        resumed_rank_count(str(run), config, nprocs_option=None, overrides=["run.steps=30"])
    assert _resume(run, "run.steps=30") == RANKS
