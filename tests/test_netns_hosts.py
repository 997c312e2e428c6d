"""Several hosts on one machine: namespace hosts, MPI and torch jobs across them, cut links.

The fixture library is tests/support/netns.py; docs/multi-host-testing.md explains
the flags. Skipped only where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.launching import pytest_summaries, ranked_pytest
from tests.support.netns import (
    LAUNCHER,
    NetnsError,
    cleanup_stale,
    create,
    destroy,
    hosts,
    leftovers,
    missing_caps,
    netns_unavailable,
)

UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no namespace hosts here: {UNAVAILABLE}")

SUITE = ranked_pytest("--timeout=90", "tests/ranked/test_comm.py")
MARK = "RANK-REPORT "
#: doubles each rank contributes to the all-reduce (8 MiB): every host must receive at least that
ALLREDUCE_N = 1 << 20

RANK_REPORT = textwrap.dedent(f"""
    import json, socket, sys
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    bridge_ip = sys.argv[1]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((bridge_ip, 9))  # no packet is sent; picks the address routed to the bridge
    data = np.arange({ALLREDUCE_N}, dtype=np.float64) + comm.rank
    total = np.empty_like(data)
    comm.Allreduce(data, total)
    n = comm.size
    expected = n * np.arange({ALLREDUCE_N}, dtype=np.float64) + n * (n - 1) / 2
    reports = comm.gather({{
        "rank": comm.rank, "size": n, "host": socket.gethostname(),
        "processor": MPI.Get_processor_name(), "ip": probe.getsockname()[0],
        "resolved": socket.gethostbyname(socket.gethostname()),
        "allreduce_ok": bool(np.array_equal(total, expected))}}, root=0)
    if comm.rank == 0:  # one line: hydra interleaves the ranks' output
        print("{MARK}" + json.dumps(reports), flush=True)
""")


def test_mpi_ranks_run_on_their_own_hosts_and_talk_over_the_bridge(netns_hosts):
    hs = netns_hosts
    before = [hs.link_bytes(h) for h in hs.hosts]
    result = hs.run_mpi(2, [sys.executable, "-c", RANK_REPORT, hs.bridge_ip], timeout=60).check()
    after = [hs.link_bytes(h) for h in hs.hosts]
    lines = [line for line in result.output.splitlines() if line.startswith(MARK)]
    assert len(lines) == 1, result.output
    reports = json.loads(lines[0][len(MARK) :])
    assert [r["rank"] for r in reports] == [0, 1, 2, 3], result.output
    by_host = {h.name: [r["rank"] for r in reports if r["host"] == h.name] for h in hs.hosts}
    assert by_host == {hs.hosts[0].name: [0, 1], hs.hosts[1].name: [2, 3]}  # hostfile h0:2, h1:2
    for r in reports:
        host = hs.host(r["host"])
        assert r["processor"] == host.name
        assert r["ip"] == r["resolved"] == host.ip
        assert r["allreduce_ok"]
    assert reports[0]["ip"] != reports[2]["ip"]
    # each host needs the other host's contribution to every element: >= 8 bytes per double in
    for h, (rx0, _), (rx1, _) in zip(hs.hosts, before, after, strict=False):
        assert rx1 - rx0 >= 8 * ALLREDUCE_N, f"{h.name} received only {rx1 - rx0} bytes over its veth"


def test_comm_suite_with_mpi_over_two_hosts(netns_hosts):
    result = netns_hosts.run_mpi(2, SUITE, timeout=150, env={"GFLOWDIST_TEST_ENGINE": "mpi"})
    result.check()
    assert len(pytest_summaries(result.output)) == 4, result.output


def test_comm_suite_with_torch_over_two_hosts(netns_hosts):
    result = netns_hosts.run_torch(SUITE, timeout=150, env={"GFLOWDIST_TEST_ENGINE": "torch"})
    result.check()
    assert len(pytest_summaries(result.output)) == 2, result.output
    for rank, host in enumerate(netns_hosts.hosts):
        assert f"rank {rank} on {host.name} (exit 0)" in result.output


def test_cut_link_isolates_a_host_and_restore_heals_it(netns_hosts):
    hs = netns_hosts
    a, b = hs.hosts
    assert hs.can_reach(a, b) and hs.can_reach(b, a)
    with hs.link_cut(b) as cut:
        assert cut == b
        assert not hs.can_reach(a, b, timeout=0.3)
        assert not hs.can_reach(b, None, timeout=0.3)
        assert hs.can_reach(a, None)  # only b's cable was pulled
    assert hs.can_reach(a, b) and hs.can_reach(b, a) and hs.can_reach(b, None)


def test_launcher_sets_host_name_and_rejects_unknown_hosts(netns_hosts):
    host = netns_hosts.hosts[1]
    ok = subprocess.run([str(LAUNCHER), "-x", host.name, "hostname"], capture_output=True, text=True, timeout=20)
    assert (ok.returncode, ok.stdout.strip()) == (0, host.name)
    bad = subprocess.run(
        [str(LAUNCHER), "-x", "gfn-no-such-host", "hostname"], capture_output=True, text=True, timeout=20
    )
    assert bad.returncode == 255 and "no network namespace named 'gfn-no-such-host'" in bad.stderr


def test_three_hosts_are_removed_with_their_processes_when_the_test_fails():
    with pytest.raises(ZeroDivisionError):
        with hosts(3) as hs:
            names = [
                subprocess.run(hs.exec_argv(h, ["hostname"]), capture_output=True, text=True, timeout=20).stdout.strip()
                for h in hs.hosts
            ]
            assert names == [h.name for h in hs.hosts] and len(set(names)) == 3
            sleeper = subprocess.Popen(hs.exec_argv(hs.hosts[2], ["sleep", "600"]), start_new_session=True)
            # the body fails once the sleeper is inside its host (before it, removing the host cannot reach it)
            ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 20
            while os.readlink(f"/proc/{sleeper.pid}/ns/net") == ours and time.monotonic() < deadline:
                time.sleep(0.01)
            raise ZeroDivisionError("the body fails on purpose")
    assert sleeper.wait(timeout=10) == -9
    assert leftovers(hs.tag) == []


def test_sets_of_dead_processes_are_cleaned_up_as_stale():
    dead = subprocess.Popen(["true"])
    dead.wait()
    tag, own = f"gfn{dead.pid}z", f"gfn{os.getpid()}z"
    try:
        hostfile = create(tag, 1).hostfile(1)
        assert sorted(leftovers(tag)) == sorted(
            [f"{tag}h0", f"{tag}br", f"{tag}v0", f"/etc/netns/{tag}h0", str(hostfile.parent)]
        )
        assert tag in cleanup_stale()
        assert leftovers(tag) == []
        create(own, 1)  # a live pid's set is left alone
        assert own not in cleanup_stale() and f"{own}h0" in leftovers(own)
    finally:
        destroy(tag)
        destroy(own)


def test_a_failed_creation_removes_what_it_made():
    tag = f"gfn{os.getpid()}y"
    subprocess.run(["ip", "link", "add", f"{tag}br", "type", "bridge"], check=True)  # name taken
    with pytest.raises(NetnsError, match=f"'ip link add {tag}br type bridge.*File exists"):
        create(tag, 2)
    assert leftovers(tag) == []


def test_missing_capabilities_are_named():
    assert missing_caps("0") == ["CAP_SYS_ADMIN", "CAP_NET_ADMIN"]
    assert missing_caps(f"{1 << 12:x}") == ["CAP_SYS_ADMIN"]
    assert missing_caps(f"{(1 << 12) | (1 << 21):x}") == []


def test_errors_name_the_problem(netns_hosts):
    with pytest.raises(NetnsError, match="no host named 'nope'"):
        netns_hosts.host("nope")
    with pytest.raises(NetnsError, match="does not fit 2 hosts"):
        netns_hosts.hostfile([1, 1, 1])
    with pytest.raises(NetnsError, match="1 to 9 hosts"):
        create("gfnunused", 10)
