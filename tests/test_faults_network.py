"""A namespace host's link cut in the middle of an MPI run (promise 3: no hangs).

The toy job runs on 4 ranks over 2 hosts (hostfile ``h0:2, h1:2``: trainers
0 and 1 on host 0, buffer 2 and coordinator 3 on host 1) with
``faults.peer_timeout_s = 3``. Once it is training, one host's cable is
pulled (``HostSet.cut_link``): nothing passes between that host and the
bridge, so its ranks are lost to the others and to ``mpiexec``. Plain MPICH
waits forever here; gflowdist must notice within the peer timeout, end the
job non-zero with a message naming a rank on the cut host (its role and
host), and leave no process in any namespace.

Each scenario (the coordinator on the cut host, or on the surviving one) runs
once, in a module fixture; two tests read it: what holds today, and the
launcher's one-line summary, which is strictly expected to fail until the
launcher change in docs/reliability.md ("Proposed runtime changes") lands.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import pytest

from tests.support.jobs import Job, layout_rows, namespace_processes
from tests.support.netns import hosts, netns_unavailable

UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no namespace hosts here: {UNAVAILABLE}")

PEER_TIMEOUT_S = 3.0
#: the launcher gives orphaned ranks 2 peer_timeout + 10 s to report (cli/run_cmd.py), then kills them
REPORT_GRACE_S = 2 * PEER_TIMEOUT_S + 10.0
LOST = re.compile(r"gflowdist: lost rank (\d+) \((\w+) on (\S+)\)")
SUMMARY = "gflowdist: the job failed (exit "


@dataclass
class CutRun:
    """What one cut-link run showed (times in seconds after the cut)."""

    cut_host: str
    rows: dict[int, dict[str, str]]
    code: int
    output: str
    message_after: float | None  # first "lost rank" line forwarded to the launcher
    exit_after: float
    left: list[int]
    left_in_namespaces: dict[str, list[int]]
    timeline: list[str] = field(default_factory=list)

    @property
    def cut_ranks(self) -> set[int]:
        return {r for r, row in self.rows.items() if row["host"] == self.cut_host}

    def names_a_cut_rank(self, line: str) -> bool:
        """The line names a rank on the cut host, with the role and host layout.txt gives it."""
        match = LOST.search(line)
        if match is None:
            return False
        rank, role, host = int(match[1]), match[2], match[3]
        return rank in self.cut_ranks and self.rows[rank]["role"] == role and host == self.cut_host


SCENARIOS = {"coordinator-on-cut-host": 1, "coordinator-on-surviving-host": 0}


@pytest.fixture(scope="module", params=list(SCENARIOS))
def cut_run(request, tmp_path_factory) -> CutRun:
    with hosts(2) as hs:
        folder = tmp_path_factory.mktemp(request.param)
        job = Job(
            folder,
            "run.steps=100000",
            "params.delay_s=0.005",
            f"faults.peer_timeout_s={PEER_TIMEOUT_S}",
            "faults.heartbeat_s=0.2",
            f"launch.mpiexec_args={json.dumps(hs.mpiexec_options(2))}",
            env=hs.mpi_env(),
        )
        victim = hs.hosts[SCENARIOS[request.param]]
        try:
            run = job.wait_for_metrics(4, timeout=120)
            rows = layout_rows(run)
            hs.cut_link(victim)
            cut = time.monotonic()
            message_after = None
            deadline = cut + 60
            while job.proc.poll() is None and time.monotonic() < deadline:
                if message_after is None and LOST.search(job.output):
                    message_after = time.monotonic() - cut
                time.sleep(0.05)
            code = job.wait(max(1.0, deadline - time.monotonic()))
            exit_after = time.monotonic() - cut
            if message_after is None and LOST.search(job.output):
                message_after = exit_after
            result = CutRun(
                victim.name,
                rows,
                code,
                job.output,
                message_after,
                exit_after,
                job.processes_left(),
                namespace_processes(hs),
            )
        finally:
            job.kill()
            job.log.close()
            hs.restore_link(victim)
        print(
            f"\n{request.param}: cut {victim.name}; first 'lost rank' line after "
            f"{result.message_after} s, launcher exit {result.code} after {result.exit_after:.1f} s"
        )
        return result


def test_cut_link_ends_the_job_naming_a_rank_of_the_cut_host_and_leaves_no_process(cut_run: CutRun):
    out = cut_run.output
    assert cut_run.code != 0, out
    # the failure the launcher prints is one that came through mpiexec, from a rank it can still reach (the
    # ranks' own failure lines are held back and printed once, in the summary): it must blame the cut host
    forwarded = [line for line in out.splitlines() if LOST.search(line)]
    assert forwarded, f"no rank reported a lost peer:\n{out}"
    assert cut_run.names_a_cut_rank(forwarded[0]), f"{forwarded[0]!r} does not name a rank on {cut_run.cut_host}"
    assert cut_run.message_after is not None and cut_run.message_after < PEER_TIMEOUT_S + 5, cut_run
    assert cut_run.exit_after < PEER_TIMEOUT_S + REPORT_GRACE_S + 10, cut_run
    assert SUMMARY in out
    assert cut_run.left == [], f"processes of the job left: {cut_run.left}"
    assert all(pids == [] for pids in cut_run.left_in_namespaces.values()), cut_run.left_in_namespaces


def test_cut_link_summary_names_the_cut_host_within_the_peer_timeout(cut_run: CutRun):
    summary = cut_run.output.split(SUMMARY, 1)[-1].splitlines()[1:2]
    assert summary and cut_run.names_a_cut_rank(summary[0]), cut_run.output[-2000:]
    assert cut_run.exit_after < PEER_TIMEOUT_S + 5, f"launcher ended {cut_run.exit_after:.1f} s after the cut"
