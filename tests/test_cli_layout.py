"""`gflowdist layout` and `python -m gflowdist` run as real subprocesses: output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("gflowdist")


def gflowdist(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gflowdist", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent("""
        launch: {nprocs: 6}
        layout: {buffers: 3, coordinator: false}
    """)
    )
    return path


def table_rows(stdout: str) -> list[list[str]]:
    lines = stdout.strip().splitlines()
    return [line.split() for line in lines[2:] if not line.startswith("note:")]


def test_prints_the_table(config: Path) -> None:
    done = gflowdist("layout", str(config), "-n", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("world of 8 ranks: 5 trainers, 0 actors, 3 buffers")
    rows = table_rows(done.stdout)
    assert [row[1] for row in rows] == [
        "trainer",
        "trainer",
        "buffer",
        "trainer",
        "trainer",
        "buffer",
        "trainer",
        "buffer",
    ]
    assert rows[0][3] == "2" and rows[6][3] == "7"  # buffer column
    assert done.stderr == ""


def test_world_size_defaults_to_launch_nprocs(config: Path) -> None:
    done = gflowdist("layout", str(config))
    assert done.returncode == 0, done.stderr
    assert len(table_rows(done.stdout)) == 6


def test_overrides_and_hosts_run_length(config: Path) -> None:
    done = gflowdist(
        "layout",
        str(config),
        "-n",
        "8",
        "--hosts",
        "a:4,b:4",
        "--set",
        "layout.buffers=2",
        "--set",
        "layout.placement=node-local",
    )
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert [row[2] for row in rows] == ["a"] * 4 + ["b"] * 4
    buffers = [row for row in rows if row[1] == "buffer"]
    assert [(row[0], row[2]) for row in buffers] == [("3", "a"), ("7", "b")]


def test_json_output(config: Path) -> None:
    done = gflowdist("layout", str(config), "-n", "4", "--json", "--hosts", "x,y,x,y", "--set", "layout.buffers=2")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["world_size"] == 4 and data["hosts"] == ["x", "y", "x", "y"]
    assert data["buffers"] == [1, 3]


@pytest.mark.parametrize(
    "extra, words",
    [
        (["-n", "4"], "layout error: 3 buffers but only 1 trainer"),
        (["-n", "0"], "error: argument -n/-np/--nprocs: expected a number of ranks >= 1, found 0"),
        (
            ["-n", "8", "--set", "layout.bufers=2"],
            "config error: layout.bufers: unknown key 'bufers' (did you mean 'buffers'?)",
        ),
        (["-n", "8", "--hosts", "a:2"], "hosts lists 2 names but the job has 8 ranks"),
        (["-n", "8", "--hosts", "a:0"], "positive integer"),
        (["-n", "8", "--set", "layout.placement=node-local"], "pass --hosts"),
    ],
)
def test_errors_exit_2_without_traceback(config: Path, extra: list[str], words: str) -> None:
    done = gflowdist("layout", str(config), *extra)
    assert done.returncode == 2
    assert done.stdout == ""
    assert words in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("gflowdist layout: ")


def test_config_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("layout:\n  buffers: two\n")
    done = gflowdist("layout", str(bad), "-n", "4")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{bad}: layout.buffers: expected an integer >= 0 or 'rest', found str 'two'" in done.stderr
    missing = gflowdist("layout", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and "config file not found" in missing.stderr


def test_usage_errors_exit_2(config: Path) -> None:
    assert gflowdist("layout").returncode == 2  # CONFIG missing
    assert gflowdist("layout", str(config), "-n", "many").returncode == 2
    assert gflowdist("nonsense").returncode == 2
    no_command = gflowdist()
    assert no_command.returncode == 2 and "usage: gflowdist" in no_command.stderr


def test_help_is_light_and_lists_layout() -> None:
    probe = textwrap.dedent("""
        import contextlib, io, sys
        from gflowdist.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(["--help"])
        heavy = sorted(m for m in ("torch", "mpi4py", "numpy") if m in sys.modules)
        print(code, heavy, "layout" in out.getvalue())
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "[]", "True"]


def test_layout_command_imports_nothing_heavy(config: Path) -> None:
    probe = textwrap.dedent(f"""
        import contextlib, io, sys
        from gflowdist.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["layout", {str(config)!r}, "-n", "8"])
        print(code, sorted(m for m in ("torch", "mpi4py") if m in sys.modules))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["0", "[]"], done.stderr


@pytest.mark.skipif(not SCRIPT.exists(), reason="console script not installed next to python")
def test_console_script(config: Path) -> None:
    done = subprocess.run(
        [str(SCRIPT), "layout", str(config), "-n", "8"], capture_output=True, text=True, timeout=60, env={**os.environ}
    )
    assert done.returncode == 0 and done.stdout.startswith("world of 8 ranks")
    version = subprocess.run([str(SCRIPT), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("gflowdist ")
