"""Every malformed config of tests/test_config_schema.py, through the real ``gflowdist run``.

The schema tests check the exception; this checks what a user sees: exit
status 2, exactly one line on stderr (``gflowdist run: config error: `` and
the ``ConfigError`` text, computed here in-process for the same file),
nothing on stdout, no traceback, and nothing launched (no run directory).
The same for the bad ``key=value`` overrides of that file's override table.

Each case is one process; they run two at a time in a module fixture and each
test reads its case's result. ``gflowdist run`` reads the config before it
imports torch (the last test checks that), so a case costs a few tenths of a
second.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gflowdist.config import Config, ConfigError
from tests.support.launching import base_env
from tests.test_config_schema import MALFORMED, OVERRIDE_ERRORS

#: a valid file for the override cases
GOOD = "run: {name: ok, steps: 3}\n"


def _case_ids() -> list[str]:
    return [f"file:{key}:{text}" for text, key, _ in MALFORMED] + [
        f"override:{override}" for override, _, _ in OVERRIDE_ERRORS
    ]


def _cli(folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", *args],
        cwd=folder,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[Path, list[str], subprocess.CompletedProcess]]:
    cases: dict[str, tuple[Path, list[str]]] = {}
    for case_id, (text, _, _) in zip(_case_ids(), MALFORMED, strict=False):
        folder = tmp_path_factory.mktemp("file")
        (folder / "bad.yaml").write_text(textwrap.dedent(text) + "\n")
        cases[case_id] = (folder, ["bad.yaml"])
    for case_id, (override, _, _) in zip(_case_ids()[len(MALFORMED) :], OVERRIDE_ERRORS, strict=False):
        folder = tmp_path_factory.mktemp("override")
        (folder / "good.yaml").write_text(GOOD)
        cases[case_id] = (folder, ["good.yaml", override])
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = {case_id: pool.submit(_cli, folder, args) for case_id, (folder, args) in cases.items()}
        return {case_id: (*cases[case_id], future.result()) for case_id, future in done.items()}


def _expected_error(folder: Path, args: list[str], monkeypatch: pytest.MonkeyPatch) -> ConfigError:
    """The error for the same file and overrides, loaded from the same directory as the CLI ran in."""
    monkeypatch.chdir(folder)
    with pytest.raises(ConfigError) as info:
        Config.from_yaml(args[0], overrides=args[1:])
    return info.value


def _check(result: subprocess.CompletedProcess, folder: Path, expected: ConfigError, words: list[str]) -> None:
    assert result.returncode == 2, result
    assert result.stdout == "", result.stdout
    assert result.stderr == f"gflowdist run: config error: {expected}\n", result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr
    assert not (folder / "runs").exists()  # nothing was launched


@pytest.mark.parametrize("case", range(len(MALFORMED)), ids=_case_ids()[: len(MALFORMED)])
def test_malformed_config_file_exits_2_with_one_line(results, case, monkeypatch):
    _, key, words = MALFORMED[case]
    folder, args, result = results[_case_ids()[case]]
    expected = _expected_error(folder, args, monkeypatch)
    assert expected.key == key
    _check(result, folder, expected, words)
    assert f"bad.yaml: {key}: " in result.stderr  # names the file and the key


@pytest.mark.parametrize("case", range(len(OVERRIDE_ERRORS)), ids=_case_ids()[len(MALFORMED) :])
def test_bad_override_exits_2_with_one_line(results, case, monkeypatch):
    _, key, words = OVERRIDE_ERRORS[case]
    folder, args, result = results[_case_ids()[len(MALFORMED) + case]]
    expected = _expected_error(folder, args, monkeypatch)
    assert expected.key == key
    _check(result, folder, expected, words)


def test_a_bad_config_fails_before_torch_is_imported(tmp_path):
    (tmp_path / "bad.yaml").write_text(MALFORMED[0][0] + "\n")
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['gflowdist', 'run', 'bad.yaml']\n"
        "try:\n    runpy.run_module('gflowdist', run_name='__main__')\n"
        "except SystemExit as done:\n"
        "    print('torch imported' if 'torch' in sys.modules else 'no torch', done.code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert result.stdout.split() == ["no", "torch", "2"], result


#: (command line after `gflowdist run good.yaml`, the one line): near misses of an override get the form to write
NEAR_MISSES = [
    (["run.steps:5"], "config error: 'run.steps:5' is YAML, not an override: write run.steps=5 (key.path=value)"),
    (
        ["launch.mpiexec:/opt/mpi/bin/mpiexec"],
        "config error: 'launch.mpiexec:/opt/mpi/bin/mpiexec' is YAML, not an override: write "
        "launch.mpiexec=/opt/mpi/bin/mpiexec (key.path=value)",
    ),
    (["--steps", "5"], "config error: '--steps' is not an option of gflowdist run: write the override run.steps=5"),
    (
        ["--log-every=7"],
        "config error: '--log-every=7' is not an option of gflowdist run: write the override run.log_every=7",
    ),
    (["--bogus", "5"], "error: unrecognized arguments: --bogus (see gflowdist run --help)"),  # no key: no hint
]


@pytest.mark.parametrize("args, line", NEAR_MISSES, ids=[" ".join(args) for args, _ in NEAR_MISSES])
def test_a_near_miss_of_an_override_says_what_to_write(tmp_path, args, line):
    (tmp_path / "good.yaml").write_text(GOOD)
    result = _cli(tmp_path, ["good.yaml", *args])
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"gflowdist run: {line}\n")
    assert not (tmp_path / "runs").exists()


def test_a_yaml_style_override_is_refused_with_the_override_it_meant(tmp_path):
    (tmp_path / "good.yaml").write_text(GOOD)
    with pytest.raises(ConfigError, match=r"^'run.steps: 5' is YAML, not an override: write run.steps=5 "):
        Config.from_yaml(str(tmp_path / "good.yaml"), overrides=["run.steps: 5"])
