"""The rank keeper: the parent exits with its child's status as a shell reports it, and takes the child with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gflowdist.process_tree import is_running, kill_group

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the keeper is Linux only")

PROGRAM = """
import os, signal, sys, time
from gflowdist.cli.rank_keeper import keep, KEEPER_VARIABLE
keep()
print(os.getpid(), os.environ[KEEPER_VARIABLE], flush=True)
action = sys.argv[1]
if action == "kill9":
    os.kill(os.getpid(), signal.SIGKILL)
elif action == "exit5":
    sys.exit(5)
elif action == "keeper-signals":
    time.sleep(1.5)  # the test sends SIGTERM/SIGINT/SIGUSR1 to the keeper meanwhile
    sys.exit(0)
else:
    time.sleep(60)
"""


def start(action: str) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, action], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child, keeper = (int(v) for v in proc.stdout.readline().split())
    return proc, child, keeper


def finish(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(30)
    finally:
        if proc.poll() is None:
            kill_group(proc.pid)
            proc.wait()


def test_a_child_killed_by_a_signal_becomes_an_exit_status_of_128_plus_the_signal():
    proc, child, keeper = start("kill9")
    assert keeper == proc.pid and child != proc.pid
    assert finish(proc) == 128 + signal.SIGKILL  # an exit, not a death by signal: hydra leaves the others


def test_an_exit_status_is_passed_on():
    proc, _, _ = start("exit5")
    assert finish(proc) == 5


def test_the_keeper_ignores_signals_and_waits_for_the_child():
    proc, _child, keeper = start("keeper-signals")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        os.kill(keeper, sig)
    assert finish(proc) == 0


def test_the_child_dies_with_its_keeper():
    proc, child, keeper = start("sleep")
    os.kill(keeper, signal.SIGKILL)
    assert finish(proc) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while is_running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_running(child), "the rank outlived its keeper"
