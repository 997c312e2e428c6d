"""Config limits and the config a launcher hands its ranks, through the real ``gflowdist run``.

A "billion laughs" of YAML aliases, a recursive alias, a file over the size
limit and a value over the per-value limit (in the file and in an override)
are each refused in one line naming the file and the key, with exit status 2
and nothing launched, within seconds (the unbounded cases used to grow past
800 MB or run for minutes). Ranks read the launcher's checked config
(``$GFLOWDIST_LAUNCH_CONFIG``), not the user's file: checked with real ranks
under mpiexec whose named config file does not even exist.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gflowdist.config import Config, ConfigError
from gflowdist.config.handoff import read_launch_config, write_launch_config
from gflowdist.config.limits import MAX_FILE_BYTES, MAX_NODES, MAX_VALUE_CHARS
from gflowdist.jobenv import IN_MPI_VARIABLE, LAUNCH_CONFIG_VARIABLE
from tests.support.jobs import TOY
from tests.support.launching import base_env, run_mpi

ROLES = "roles: {trainer: toy_roles.py:ToyTrainer}\n"


def _laughs(levels: int) -> str:
    lines = ["params:", "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for k in range(1, levels):
        lines.append(f"  l{k}: &l{k} [{', '.join([f'*l{k - 1}'] * 10)}]")
    return ROLES + "\n".join(lines) + "\n"


CASES = {
    # name: (file text, overrides, the key named, words in the line)
    "billion-laughs": (_laughs(9), [], "params.l4", ["more than", "aliases"]),
    "recursive-alias": (ROLES + "params:\n  a: &a [1, *a]\n", [], "params.a[1]", ["recursive alias"]),
    "big-value": (ROLES + "params:\n  blob: " + "x" * (MAX_VALUE_CHARS + 1) + "\n", [], "params.blob", ["at most"]),
    "big-key": (ROLES + "params:\n  ? " + "k" * (MAX_VALUE_CHARS + 1) + "\n  : 1\n", [], "params", ["key of"]),
    "big-list": (ROLES + "params:\n  xs:\n" + "    - 1\n" * (MAX_NODES + 1), [], "params.xs", ["more than"]),
    "big-override": (ROLES, ["params.blob=" + "y" * (MAX_VALUE_CHARS + 1)], "params.blob", ["at most"]),
}


def _cli(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", *args],
        cwd=folder,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_config_over_a_limit_is_one_line_naming_the_key_before_launch(tmp_path, case):
    text, overrides, key, words = CASES[case]
    (tmp_path / "c.yaml").write_text(text)
    result = _cli(tmp_path, ["c.yaml", *overrides])
    assert result.returncode == 2, result
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    where = f"{key}: " if overrides else f"c.yaml: {key}: "
    assert where in lines[0], lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert len(lines[0]) < 400  # the value itself is not echoed back
    assert not (tmp_path / "runs").exists()  # nothing was launched


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    # a list of numbers, valid YAML: over the limit by size alone (used to give no output for minutes)
    (tmp_path / "c.yaml").write_text(ROLES + "params:\n  xs: [" + "1, " * (MAX_FILE_BYTES // 3) + "1]\n")
    result = _cli(tmp_path, ["c.yaml"])
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert line.startswith("gflowdist run: config error: c.yaml: the file is ") and "\n" not in line
    assert f"at most {MAX_FILE_BYTES:,} bytes" in line
    assert not (tmp_path / "runs").exists()


def test_the_limits_hold_in_process_for_the_billion_laughs():
    from gflowdist.config import parse_yaml

    with pytest.raises(ConfigError) as info:
        parse_yaml(_laughs(12), file="lol.yaml")  # 10^12 values once expanded; l4 holds 111,111 > MAX_NODES
    assert info.value.key == "params.l4" and info.value.file == "lol.yaml"
    shared = parse_yaml(_laughs(4))  # 10^4 values expanded: within the limit, still read
    assert len(shared["params"]["l3"]) == 10


def test_ranks_run_the_config_the_launcher_handed_them(tmp_path):
    """Three real ranks under mpiexec, named a config file that does not exist: they run the handed one."""
    config = Config.from_yaml(TOY, overrides=["run.steps=6", f"run.out_dir={tmp_path}/runs", "params.n=4"])
    run_dir = tmp_path / "runs" / "handed"
    run_dir.mkdir(parents=True)
    handed = write_launch_config(run_dir, config)
    assert read_launch_config(handed) == config and read_launch_config(handed).file == str(TOY)
    argv = [sys.executable, "-m", "gflowdist", "run", str(tmp_path / "gone.yaml"), "run.steps=999"]
    env = {IN_MPI_VARIABLE: "1", LAUNCH_CONFIG_VARIABLE: str(handed), "GFLOWDIST_RUN_DIR": str(run_dir)}
    result = run_mpi(3, argv, env=env, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.output
    recorded = Config.from_yaml(run_dir / "config.yaml")
    assert recorded.run.steps == 6 and recorded.params["n"] == 4  # the handed config, not the argv


def test_a_handed_file_that_is_not_a_config_names_the_file(tmp_path):
    (tmp_path / "h.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError) as info:
        read_launch_config(tmp_path / "h.yaml")
    assert info.value.file == str(tmp_path / "h.yaml")
