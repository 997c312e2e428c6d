"""`gflowdist doctor`: passes on this machine (both pings), names the fix when mpiexec is hidden,
diagnoses an mpiexec that does not belong to mpi4py's MPI, and kills what it starts.

Every doctor runs as a subprocess in its own session with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gflowdist.cli import doctor_cmd, doctor_ping
from gflowdist.cli.doctor_check import FAILED, MISSING, OK, Check, Launched
from gflowdist.jobenv import locate_mpiexec
from tests.support.launching import REPO, base_env, kill_session

DOCTOR_TIMEOUT_S = 120


def doctor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gflowdist", "doctor", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=base_env(**env),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=DOCTOR_TIMEOUT_S)
    finally:
        kill_session(proc)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def status_of(stdout: str, name: str) -> str:
    """The status word of the check line named ``name`` in the text output."""
    for line in stdout.splitlines():
        words = line.split(None, 1)
        if len(words) == 2 and words[1].startswith(name + " "):
            return words[0]
    raise AssertionError(f"no line for {name!r} in:\n{stdout}")


def test_doctor_passes_on_this_machine() -> None:
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    for name in (
        "python",
        "torch",
        "numpy",
        "mpi4py",
        "msgpack",
        "PyYAML",
        "MPI library",
        "mpiexec",
        "gloo",
        "mpi ping",
        "gloo ping",
    ):
        assert status_of(done.stdout, name) == OK, name
    mpiexec_line = next(line for line in done.stdout.splitlines() if " mpiexec " in line)
    assert str(Path(sys.executable).parent / "mpiexec") in mpiexec_line
    for ping in ("mpi ping", "gloo ping"):
        line = next(line for line in done.stdout.splitlines() if f" {ping} " in line)
        assert f"median of {doctor_ping.PING_ROUNDS} x {doctor_ping.PING_BYTES} B" in line
    assert done.stdout.rstrip().endswith("all essential checks passed")


def test_hidden_mpiexec_is_missing_with_the_fix() -> None:
    done = doctor("--json", GFLOWDIST_MPIEXEC="/nonexistent/mpiexec")
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(done.stdout)
    checks = {c["name"]: c for c in data["checks"]}
    assert data["ok"] is False
    mpiexec = checks["mpiexec"]
    assert mpiexec["status"] == MISSING and mpiexec["essential"]
    assert mpiexec["detail"] == "/nonexistent/mpiexec (GFLOWDIST_MPIEXEC) does not exist"
    assert "unset GFLOWDIST_MPIEXEC" in mpiexec["fix"] and "pip install mpich" in mpiexec["fix"]
    assert checks["mpi ping"]["status"] == FAILED
    assert checks["mpi ping"]["detail"].startswith("not run")
    assert checks["gloo ping"]["status"] == OK  # the other engine is still checked
    assert all(c["status"] in (OK, MISSING, FAILED) for c in data["checks"])


def test_mpiexec_of_another_mpi_is_diagnosed(tmp_path: Path) -> None:
    """A launcher that starts singletons (as a foreign mpiexec does) gives a world of 1."""
    fake = tmp_path / "mpiexec"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "fake 1.0"; exit 0; fi\nshift 2\nexec "$@"\n'
    )  # drops "-n 2" and runs the program once
    fake.chmod(0o755)
    check = doctor_ping.mpi_ping_verdict(doctor_ping.start_mpi_ping(str(fake), (), 60).finish(), 60)
    assert check.status == FAILED
    assert "world of 1, not 2" in check.detail
    assert "does not match mpi4py's MPI library" in check.fix


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    program = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    [(code, _, killed)] = Launched([([sys.executable, "-c", program], base_env())], timeout=1.5).finish()
    assert killed and code == -signal.SIGKILL
    assert time.monotonic() - start < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ", 1)[1].startswith("Z"))


def test_mpiexec_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GFLOWDIST_MPIEXEC", "/from/env")
    assert locate_mpiexec("/from/config") == ("/from/config", "launch.mpiexec")
    assert locate_mpiexec(None) == ("/from/env", "GFLOWDIST_MPIEXEC")
    monkeypatch.delenv("GFLOWDIST_MPIEXEC")
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        assert locate_mpiexec(None) == (str(beside), "next to this Python")
    on_path = tmp_path / "mpirun"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert locate_mpiexec("mpirun") == (str(on_path), "launch.mpiexec")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert locate_mpiexec(None) == (None, "PATH")


@pytest.mark.parametrize(
    "output, expected",
    [
        ("HYDRA build details:\n    Version:     5.0.2\n    Release Date: x\n", "HYDRA 5.0.2"),
        (
            "mpiexec (Open MPI) 4.1.5\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
            "mpiexec (Open MPI) 4.1.5",
        ),
        ("", "(printed no version)"),
    ],
)
def test_mpiexec_version_line(output: str, expected: str) -> None:
    assert doctor_cmd.mpiexec_version(output) == expected


def test_only_essential_checks_decide_the_verdict() -> None:
    checks = [Check("torch", OK, "2.13"), Check("CUDA", MISSING, "no device", fix="a GPU", essential=False)]
    text = doctor_cmd.render(checks, ok=True)
    assert text.splitlines() == [
        "gflowdist doctor",
        "  ok       torch  2.13",
        "  MISSING  CUDA   no device (optional)",
        "                  fix: a GPU",
        "all essential checks passed",
    ]
    failing = [*checks, Check("mpi ping", FAILED, "timed out", fix="x")]
    assert doctor_cmd.render(failing, ok=False).endswith("1 essential check did not pass: mpi ping")


@pytest.mark.parametrize(
    "output, status, words",
    [
        (
            'noise\nGFLOWDIST_PING {"size": 2, "rounds": 20, "bytes": 1024, "rtt_median_s": 0.002, '
            '"rtt_min_s": 0.001}\n',
            OK,
            "round trip 2.000 ms (median of 20 x 1024 B; min 1.000 ms)",
        ),
        ('GFLOWDIST_PING {"size": 1, "error": "the ranks saw a world of 1, not 2"}\n', FAILED, "world of 1"),
        (
            "Traceback (most recent call last):\nDeadlineError: receive on tag 7 timed out\n",
            FAILED,
            "exit status 1: DeadlineError: receive on tag 7 timed out",
        ),
        ("GFLOWDIST_PING {not json\n", FAILED, "unreadable result line"),
    ],
)
def test_ping_output_is_read(output: str, status: str, words: str) -> None:
    code = 0 if status == OK else 1
    check = doctor_ping.ping_verdict("mpi ping", code, output, failed_fix="fix it", wrong_world_fix="another mpiexec")
    assert check.status == status and words in check.detail
    assert check.fix == (None if status == OK else "another mpiexec" if "world of 1" in words else "fix it")


def test_configured_mpiexec_that_is_not_executable(tmp_path: Path) -> None:
    plain = tmp_path / "mpiexec"
    plain.write_text("not a program\n")
    check, found = doctor_cmd.mpiexec_check(str(plain))
    assert found is None and check.status == MISSING
    assert check.detail == f"{plain} (launch.mpiexec) is not an executable file"
    assert check.fix.startswith("fix launch.mpiexec")


def test_a_timeout_of_zero_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from gflowdist.cli import main

    assert main(["doctor", "--timeout", "0"]) == 2
    assert capsys.readouterr().err == ("gflowdist doctor: config error: --timeout: must be > 0 seconds, got 0\n")
