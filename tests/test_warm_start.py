"""Warm start (:mod:`gflowdist.cli.warm_parent`): MPI ranks forked from one process that imported torch once.

With a warm parent and a keeper of the tests' own (``tests/jobs/warm_keeper.py`` forking
``tests/jobs/warm_rank.py``): the rank gets the keeper's descriptors at their numbers, its environment,
directory and affinity, and a session of its own; the keeper exits with the rank's status (a signal's as a
shell reports it), passes SIGTERM on, and takes the rank with it when it is killed; a keeper whose Python
differs from the warm parent's is refused and told why, as is one with no warm parent to reach.

With the real CLI, under mpiexec and on the torch engine: every rank of a job starts warm from one warm parent,
which has ended when the job has; ``launch.warm_start: false`` starts every rank cold; left null, ranks start
warm where they outnumber the cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gflowdist.cli.warm_parent import warm_parent, warm_wanted
from tests.support.jobs import read_json
from tests.support.launching import REPO, base_env, kill_session, new_marker


@pytest.fixture(scope="module")
def warm() -> Iterator[dict[str, str]]:
    with warm_parent(base_env()) as started:
        yield started.variables


@pytest.fixture
def keepers() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            kill_session(proc, new_marker())
            proc.wait()


def _keeper(
    keepers: list,
    mode: str,
    warm: dict[str, str],
    pass_fds: tuple[int, ...] = (),
    flags: tuple[str, ...] = (),
    module: str = "tests.jobs.warm_keeper",
    **env: str,
):
    proc = subprocess.Popen(
        [sys.executable, *flags, "-m", module, mode],
        env=base_env(**warm, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    keepers.append(proc)
    return proc


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_rank_takes_its_keepers_descriptors_environment_and_directory_and_its_status_is_the_keepers(warm, keepers):
    extra_read, extra_write = os.pipe()
    os.set_inheritable(extra_read, True)
    try:
        proc = _keeper(keepers, "report", warm, pass_fds=(extra_read,), WARM_TEST_PROBE="probe")
        out, _ = proc.communicate(timeout=120)
    finally:
        os.close(extra_read)
        os.close(extra_write)
    assert proc.returncode == 7, out
    info = json.loads(out.strip().splitlines()[-1])
    assert re.fullmatch(r"warm: forked by the warm parent \(pid \d+\)", info["start"]), info
    assert info["keeper"] == str(proc.pid) and info["probe"] == "probe", info
    assert info["ppid"] != proc.pid and info["sid"] == info["pid"], info  # the warm parent's child, own session
    assert info["torch"], "the warm parent imported torch before the fork"
    assert info["dynamo"], "and torch._dynamo (launch.warm_imports' default)"
    assert info["frozen"] > 100_000, "and froze what it imported: no collection of the rank walks it"
    assert info["cwd"] == str(REPO) and info["argv"] == [str(REPO / "tests" / "jobs" / "warm_rank.py"), "report"], info
    assert info["affinity"] == sorted(os.sched_getaffinity(0)), info
    assert {0, 1, 2, extra_read} <= set(info["fds"]), info  # printed through the keeper's own stdout


def test_the_warm_parent_imports_what_launch_warm_imports_lists_and_names_one_it_cannot(keepers, capfd):
    with warm_parent(base_env(), ()) as started:  # warm_imports: []
        out, _ = _keeper(keepers, "report", started.variables).communicate(timeout=120)
    info = json.loads(out.strip().splitlines()[-1])
    assert info["start"].startswith("warm:") and info["torch"] and not info["dynamo"], info
    with warm_parent(base_env(), ("gflowdist_no_such_module",)) as started:
        proc = _keeper(keepers, "report", started.variables)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3 and re.search(r"^cold: ", out, re.M), out  # the test keeper's cold start
    said = capfd.readouterr().err  # the warm parent's stderr is the launcher's
    assert (
        "gflowdist warm parent: launch.warm_imports: cannot import 'gflowdist_no_such_module' "
        "(No module named 'gflowdist_no_such_module'); the ranks start cold"
    ) in said, said


def _signal_state(pid: int) -> str:
    """What the kernel says of a process's signals and threads (for a failure message)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        threads = {
            task.name: (task / "stat").read_text().rsplit(")", 1)[1].split()[0] + " " + (task / "wchan").read_text()
            for task in Path(f"/proc/{pid}/task").iterdir()
        }
    except OSError as err:
        return f"pid {pid}: {err}"
    return (
        f"pid {pid}: "
        + "; ".join(line for line in status if line.startswith(("State", "Sig", "Shd")))
        + f"; threads {threads}"
    )


def test_sigterm_to_the_keeper_reaches_the_rank(warm, keepers):
    proc = _keeper(keepers, "sigterm", warm)
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready", ready
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=70)
    except subprocess.TimeoutExpired:  # the rank said it waited 60 s; or neither ended: say where each stands
        pytest.fail(
            f"the keeper did not end in 70 s; keeper {_signal_state(proc.pid)}; rank {_signal_state(int(ready[1]))}"
        )
    assert proc.returncode == 0 and "got SIGTERM" in out, out


def test_a_rank_killed_by_a_signal_is_a_keeper_exiting_128_plus_the_signal(warm, keepers):
    proc = _keeper(keepers, "kill", warm)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGKILL, out


def test_a_killed_keeper_takes_its_rank_with_it(warm, keepers):
    proc = _keeper(keepers, "sleep", warm)
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[0] == "ready", ready
    rank = int(ready[1])
    assert _alive(rank)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 30
    while _alive(rank):
        assert time.monotonic() < deadline, f"rank {rank} outlived its keeper by 30 s"
        time.sleep(0.05)


def test_a_keeper_whose_python_differs_or_that_has_no_warm_parent_starts_cold_and_says_why(warm, keepers):
    differs = _keeper(keepers, "report", warm, PYTHONWARMTEST="1")
    optimised = _keeper(keepers, "report", warm, flags=("-O",))
    nowhere = _keeper(keepers, "report", {k: v + ".absent" for k, v in warm.items()})
    out, _ = differs.communicate(timeout=60)
    assert differs.returncode == 3, out
    assert "cold: the warm parent did not start the rank: the keeper's PYTHON* variables differ" in out, out
    assert "(PYTHONWARMTEST)" in out, out
    out, _ = optimised.communicate(timeout=60)
    assert optimised.returncode == 3 and "another Python, or with other options" in out, out
    out, _ = nowhere.communicate(timeout=60)
    assert nowhere.returncode == 3 and re.search(r"^cold: no warm parent at \S+\.absent \(", out, re.M), out


def test_a_keeper_hands_its_rank_over_before_it_reads_anything_and_if_refused_forks_it_cold_without_a_retry(
    warm, keepers
):
    """``gflowdist run`` as a keeper of a launch with a warm parent: the rank is handed over before the command
    line's parser or the config is loaded (their imports cost a keeper 0.15 CPU-s), with the launcher's bound. The
    rank (no spy in it: the warm parent forked it) then fails on the missing config, and the keeper exits with its
    status. Refused, the keeper reads the config and forks the rank cold itself, not asking the warm parent again."""
    bound = {"GFLOWDIST_KEEPER_BOUND_S": "7.5", "IN_MPI": "1"}
    missing = str(REPO / "tests" / "jobs" / "no_such_config.yaml")
    handed = _keeper(keepers, missing, warm, module="tests.jobs.handing_keeper", **bound)
    out, _ = handed.communicate(timeout=120)
    said = out.strip().splitlines()
    assert json.loads(said[0]) == {"tried": 7.5, "by_signal": False, "loaded": []}, out
    assert handed.returncode == 2 and said[1:] == [f"gflowdist run: config error: {missing}: config file not found"], (
        out
    )  # the rank's
    toy = str(REPO / "tests" / "jobs" / "toy.yaml")
    refused = _keeper(keepers, toy, warm, module="tests.jobs.handing_keeper", **bound, PYTHONWARMTEST="1")
    out, _ = refused.communicate(timeout=120)
    said = out.strip().splitlines()
    assert refused.returncode == 0 and len(said) == 3, out
    assert json.loads(said[0])["tried"] == 7.5 and "returned" in json.loads(said[1]), out
    kept = json.loads(said[2])
    assert kept["keep"] == 8.0 and kept["warm"] is None, out  # the config's bound: faults.peer_timeout_s 6 + 2 s
    assert kept["start"].startswith("cold: the warm parent did not start the rank: the keeper's PYTHON*"), out


def test_running_a_command_loads_that_command_only():
    probe = (
        "import sys\n"
        "from gflowdist.cli import main\n"
        "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('gflowdist.cli.') and m.endswith('_cmd')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO, env=base_env()
    )
    assert out.returncode == 0, out.stderr
    assert "usage: gflowdist run" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "['gflowdist.cli.run_cmd']", out.stdout


def test_a_jobs_ranks_start_warm_from_one_warm_parent_or_cold_when_the_config_says_so(job_factory):
    warm_jobs = {
        4: job_factory("-n", "4", "run.steps=3", "launch.warm_start=true"),
        3: job_factory("-n", "3", "--engine", "torch", "run.steps=3", "launch.warm_start=true"),
    }
    cold_job = job_factory("-n", "3", "run.steps=3", "launch.warm_start=false")
    for job in (*warm_jobs.values(), cold_job):
        assert job.wait(180) == 0, job.output
        assert read_json(job.run_dir() / "ledger.json")["balanced"]
        assert job.no_process_left(), job.processes_left()
    for size, job in warm_jobs.items():
        starts = [_start_line(job.run_dir(), rank) for rank in range(size)]
        pattern = r"warm: forked by the warm parent \(pid (\d+)\)"
        parents = {m.group(1) for s in starts if (m := re.fullmatch(pattern, s))}
        assert len(parents) == 1 and len(set(starts)) == 1, starts
        assert not _alive(int(parents.pop()))
    assert [_start_line(cold_job.run_dir(), rank) for rank in range(3)] == ["cold"] * 3


def _start_line(run_dir: Path, rank: int) -> str:
    text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
    found = re.search(r"INFO gflowdist\.runtime: started (.*)$", text, re.M)
    assert found, text
    return found.group(1)


def test_by_default_ranks_start_warm_only_where_they_outnumber_the_cores():
    assert warm_wanted(None, 3, cores=2) and warm_wanted(None, 9, cores=8)
    assert not warm_wanted(None, 2, cores=2) and not warm_wanted(None, 8, cores=64)
    assert warm_wanted(True, 1, cores=64) and not warm_wanted(False, 64, cores=2)


_TAKE = """
import fcntl, json, os
from gflowdist.cli.warm_parent import Request, _take_descriptors

def high(fd):
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 30)
    os.close(fd)
    return moved

pipes = {name: [high(end) for end in os.pipe()] for name in ("seven", "eight", "line")}
inode = {name: os.fstat(ends[0]).st_ino for name, ends in pipes.items()}
# the keeper's line arrived at 7, a number the keeper's own descriptor 7 is to take
os.dup2(pipes["line"][0], 7)
os.close(pipes["line"][0])
fds = {0: 0, 1: 1, 2: 2, 7: pipes["seven"][0], 8: pipes["eight"][0]}
request = Request([], {}, "/", [], 0o22, fds, 7, "gflowdist")
_take_descriptors(request)
print(json.dumps({
    "line": os.fstat(request.keeper_line).st_ino == inode["line"],
    "7": os.fstat(7).st_ino == inode["seven"],
    "8": os.fstat(8).st_ino == inode["eight"],
    "line_above": request.keeper_line > 8,
}))
"""


def test_the_keepers_line_stays_its_own_when_it_arrived_at_a_number_the_keeper_uses():
    """The line arrived at descriptor 7, one of the keeper's numbers: the rank's 7 is the keeper's 7 and its
    line is still the keeper's pipe (it was replaced by a copy of another descriptor: a coordinator watched
    another rank's stderr and killed itself when that rank ended)."""
    out = subprocess.run(
        [sys.executable, "-c", _TAKE], capture_output=True, text=True, timeout=60, cwd=REPO, env=base_env()
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"line": True, "7": True, "8": True, "line_above": True}
