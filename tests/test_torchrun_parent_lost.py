"""The compat ``fork()`` (torchrun under OmniSafe's launcher contract): when the process that called it is
SIGKILLed, torchrun and its workers end too (``PR_SET_PDEATHSIG``), instead of training on as orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.launching import MARKER_VARIABLE, base_env, kill_session, new_marker, processes_with_marker

PARENT = """
import sys
from gflowdist.launch.torchrun import fork
fork(2, manual_args=[sys.argv[1]])
"""
WORKER = """
import os, time
# written whole, then renamed: the test reads the pid as soon as the file's name appears
partial = os.path.join(os.environ["OUT"], f"partial-{os.environ['RANK']}")
with open(partial, "w") as f:
    f.write(str(os.getpid()))
os.replace(partial, os.path.join(os.environ["OUT"], f"worker-{os.environ['RANK']}"))
time.sleep(300)
"""


def test_torchrun_and_its_workers_end_when_the_caller_is_killed(tmp_path):
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "worker.py").write_text(WORKER)
    marker = new_marker()
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "worker.py")],
        # torchrun's log folder outlives a killed caller: it lands in the test's own folder, not in /tmp
        env=base_env(OUT=str(tmp_path), TMPDIR=str(tmp_path), **{MARKER_VARIABLE: marker}),
        start_new_session=True,
    )
    proc.gflowdist_marker = marker
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("worker-*"))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "the workers never started"
            time.sleep(0.1)
        workers = [int(p.read_text()) for p in tmp_path.glob("worker-*")]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 40  # torchrun gives its workers up to 30 s after SIGTERM
        while processes_with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with_marker(marker) == [], "torchrun or a worker outlived the killed caller"
        assert all(
            not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z" for pid in workers
        )
    finally:
        kill_session(proc)
