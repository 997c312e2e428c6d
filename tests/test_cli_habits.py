"""Habits of neighbouring tools, answered: -np, torchrun's --nproc-per-node, report without a run directory,
doctor CONFIG and the extras a config needs, YAML errors naming where the structure began, module:Class
when a file of that name is beside the config."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from gflowdist.cli import build_parser, doctor_cmd, main
from gflowdist.cli.preflight import Extra, check_extras, needed_extras
from gflowdist.config import Config
from gflowdist.errors import ConfigError
from gflowdist.timing import build_report
from tests.support.launching import REPO

HYPERGRID = REPO / "examples" / "hypergrid" / "config.yaml"
APEX = REPO / "examples" / "apex_cartpole" / "config.yaml"


def _code(argv: list[str]) -> int:
    """The exit status of ``gflowdist ARGV`` (an option among the overrides exits from the command's parser)."""
    try:
        return main(argv)
    except SystemExit as done:
        return int(done.code)


def test_np_is_accepted_as_mpiexec_users_type_it(capsys):
    assert build_parser().parse_args(["run", "-np", "3", str(HYPERGRID)]).nprocs == 3
    assert main(["run", str(HYPERGRID), "-np", "3", "layout.buffers=5"]) == 2  # -np 3 taken: 3 ranks, 5 buffers
    assert "-n 3" in capsys.readouterr().err
    assert main(["layout", str(HYPERGRID), "-np", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 3
    assert main(["layout", "-np", "5", str(HYPERGRID), "--json"]) == 0  # before the config too
    assert json.loads(capsys.readouterr().out)["world_size"] == 5


@pytest.mark.parametrize(
    "argv",
    [
        ["run", str(HYPERGRID), "--nproc-per-node", "4"],
        ["run", "--nproc_per_node=4", str(HYPERGRID)],
        ["layout", str(HYPERGRID), "--nproc-per-node=4"],
    ],
)
def test_torchruns_option_is_answered_with_the_form_to_write(argv, capsys):
    assert _code(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun's option" in err and "write -n 4" in err
    assert "torchrun --standalone --nproc-per-node 4 -m gflowdist run CONFIG" in err


def _fake_run(folder: Path, loss: float) -> Path:
    folder.mkdir(parents=True)
    report = build_report({}, roles={0: "trainer"}, metrics=[{"step": 0, "loss": loss}])
    (folder / "report.json").write_text(report.to_json())
    totals = dict.fromkeys(("produced", "used_locally", "received", "admitted", "dropped", "in_flight"), 0)
    (folder / "ledger.json").write_text(json.dumps({"balanced": True, "totals": totals}))
    (folder / "config.yaml").write_text("run: {}\n")
    return folder


def test_report_without_a_run_directory_opens_the_newest_run_and_says_which(tmp_path, monkeypatch, capsys):
    older = _fake_run(tmp_path / "runs" / "a-20260101-000000", loss=1.0)
    newer = _fake_run(tmp_path / "runs" / "b-20260101-000001", loss=2.0)
    (tmp_path / "runs" / "notes").mkdir()  # not a run
    os.utime(older / "config.yaml", (1e9, 1e9))
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f"gflowdist report: the newest of 2 runs in runs: {Path('runs') / newer.name}"
    assert "loss" in out and "2 @0" in out
    assert main(["report", str(tmp_path / "runs")]) == 0  # a parent folder: the same
    assert f"in {tmp_path / 'runs'}: {newer}" in capsys.readouterr().err
    assert main(["report", str(older)]) == 0  # a run directory is taken as it is, and nothing said
    out, err = capsys.readouterr()
    assert err == "" and "1 @0" in out


def test_report_without_runs_says_what_to_give(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    assert "no run directory given and no runs/ here" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert f"{tmp_path / 'empty'}: no run directory in it" in capsys.readouterr().err


def _doctor(monkeypatch, capsys, *argv: str) -> tuple[int, dict]:
    monkeypatch.setattr(doctor_cmd, "run_checks", lambda *a, **k: [])  # no pings: only the config's checks
    code = main(["doctor", *argv, "--json"])
    out = capsys.readouterr().out
    return code, (json.loads(out) if out else {})


def test_doctor_takes_the_config_positionally_and_checks_its_extras(monkeypatch, capsys):
    code, answer = _doctor(monkeypatch, capsys, str(APEX), "run.tensorboard=true")
    names = {c["name"]: c for c in answer["checks"]}
    assert code == 0 and names["extra tensorboard"]["status"] == "ok" and names["extra gymnasium"]["status"] == "ok"
    assert "roles.py uses gymnasium environments" in names["extra gymnasium"]["detail"]
    code, flagged = _doctor(monkeypatch, capsys, "--config", str(APEX), "run.tensorboard=true")  # the flag stays
    assert code == 0 and flagged == answer
    code, plain = _doctor(monkeypatch, capsys, str(HYPERGRID))
    assert code == 0 and plain["checks"] == []  # the HyperGrid example needs no extra


def test_doctor_names_a_missing_extra_with_the_pip_command(monkeypatch, capsys):
    monkeypatch.setattr(Extra, "installed", lambda self: self.module != "gymnasium")
    code, answer = _doctor(monkeypatch, capsys, str(APEX))
    (check,) = answer["checks"]
    assert code == 1 and check["name"] == "extra gymnasium" and check["status"] == "MISSING"
    assert check["fix"] == "pip install 'gflowdist[rl]'" and "(roles.trainer)" in check["detail"]


def test_doctor_refuses_two_configs(monkeypatch, capsys):
    monkeypatch.setattr(doctor_cmd, "run_checks", lambda *a, **k: [])
    assert main(["doctor", str(APEX), "--config", str(HYPERGRID)]) == 2
    assert "two configs" in capsys.readouterr().err


def test_run_refuses_before_launch_a_config_whose_extra_is_missing(monkeypatch):
    monkeypatch.setattr(Extra, "installed", lambda self: False)
    config = Config.from_yaml(APEX, overrides=["run.tensorboard=true"])
    assert [e.module for e in needed_extras(config)] == ["tensorboard", "gymnasium"]
    with pytest.raises(ConfigError) as info:
        check_extras(config)
    assert info.value.key == "run.tensorboard" and "pip install 'gflowdist[tensorboard]'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        check_extras(Config.from_yaml(APEX))
    assert info.value.key == "roles.trainer" and "gymnasium" in str(info.value) and "gflowdist[rl]" in str(info.value)
    assert needed_extras(Config.from_dict({"params": {"env_id": "CartPole-v1"}}))[0].key == "params.env_id"


@pytest.mark.parametrize(
    "text, gave_up, began",
    [
        (
            "run:\n  name: x\nlaunch: {nprocs: 4\nlayout:\n  trainers: 1\n",
            "line 4, column 7",
            "a flow mapping began at line 3, column 9 (launch: {nprocs: 4), and is not closed",
        ),
        (
            'run:\n  name: "x\nlaunch:\n  nprocs: 4\n',
            "line 5, column 1",
            'a quoted scalar began at line 2, column 9 (name: "x), and is not closed',
        ),
        (
            "roles: [a, b\nrun: {}\n",
            "line 2, column 4",
            "a flow sequence began at line 1, column 8 (roles: [a, b), and is not closed",
        ),
    ],
)
def test_a_yaml_error_names_where_the_structure_began_as_well_as_where_the_parser_gave_up(
    tmp_path, capsys, text, gave_up, began
):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert main(["layout", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"invalid YAML at {gave_up}" in err and began in err


def test_a_module_reference_hints_the_file_of_that_name_beside_the_config(tmp_path, capsys):
    folder = tmp_path / "dice"
    shutil.copytree(REPO / "examples" / "hypergrid", folder)
    os.rename(folder / "roles.py", folder / "dice.py")
    config = folder / "config.yaml"
    config.write_text(config.read_text().replace("roles.py:", "dice:"))
    assert main(["layout", str(config)]) == 2
    err = capsys.readouterr().err
    assert "roles.trainer: cannot import module 'dice': no module named 'dice'" in err
    assert "dice.py is beside the config: a file is named with its .py, write dice.py:HyperGridTrainer" in err
    config.write_text(config.read_text().replace("dice:", "nosuch:"))
    assert main(["layout", str(config)]) == 2
    assert "beside the config" not in capsys.readouterr().err
