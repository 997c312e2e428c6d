"""``gflowdist.cli.supervise`` during a stop (SIGTERM to the launcher) whose MPI launcher ends before its ranks.

A CI run once saw it: mpiexec ended with status 141 (SIGPIPE) while the job was stopping after a spawned
replacement had ended, and the coordinator, still writing the ledger, was killed with the other leftovers. The
ranks still stopping now get what is left of the stop's grace. Each case runs in a child Python of its own (a
subreaper with its own signal handlers): a "launcher" that starts a "rank" in a session of its own (as hydra
does) and exits with 141 at the SIGTERM it is forwarded; the rank writes a file after ``work_s``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.launching import REPO

CASE = textwrap.dedent(
    """
    import os, signal, subprocess, sys, threading, time
    from gflowdist.cli.supervise import supervise
    from gflowdist.process_tree import become_subreaper

    work_s, grace_s, mark = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    become_subreaper()
    rank = f"import time; time.sleep({work_s}); open({mark!r}, 'w').write('ledger')"
    launcher = (
        "import os, signal, subprocess, sys, time\\n"
        f"subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True)\\n"
        "signal.signal(signal.SIGTERM, lambda *_: os._exit(141))\\n"
        "time.sleep(60)\\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    threading.Timer(1.2, os.kill, (os.getpid(), signal.SIGTERM)).start()  # after the tracker has seen the rank
    began = time.monotonic()
    ended = supervise([proc], stop_grace_s=grace_s)
    print(f"code {ended.code} interrupted {ended.interrupted} after {time.monotonic() - began:.1f}", flush=True)
    """
)


def _stop(tmp_path, work_s: float, grace_s: float) -> tuple[str, bool]:
    mark = tmp_path / "ledger"
    out = subprocess.run(
        [sys.executable, "-c", CASE, str(work_s), str(grace_s), str(mark)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip(), mark.exists()


def test_ranks_still_stopping_when_the_launcher_ends_finish_within_the_grace(tmp_path):
    line, written = _stop(tmp_path, work_s=3.0, grace_s=30.0)
    assert written, line  # the rank outlived its launcher and finished its work
    assert line.startswith("code 141 interrupted True"), line  # the launcher's own status, judged later


def test_ranks_past_the_grace_are_still_killed(tmp_path):
    line, written = _stop(tmp_path, work_s=20.0, grace_s=1.0)
    assert not written, line
    code, seconds = line.split()[1], float(line.split()[-1])
    assert code == "141" and seconds < 15, line  # killed at the grace's end, not after the rank's 20 s
