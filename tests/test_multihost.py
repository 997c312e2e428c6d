"""The HyperGrid example on two namespace "hosts", with MPI and with the torch engine.

Six ranks (3 trainers averaging gradients, 2 buffers, 1 coordinator) are
interleaved over the hosts, rank ``r`` on host ``r % 2``, and
``layout.placement=node-local`` must give each host its own buffer serving
only the trainers on that host (block placement would pair trainer 1 on host
1 with buffer 2 on host 0). The run must look like a one-host run: every
rank reports, the ledger balances with the trajectory count the config
implies, the trainers log the example's metrics, and the gradient averages
really cross the bridge (each host's veth receives at least one float32
gradient per step). See docs/multi-host-testing.md for the flags.

While the jobs run, the TCP sockets they listen on are read from /proc: every
MPI rank's (UCX) on its host's own address only, mpiexec's control port on
every address of the launcher's host; on the torch engine gloo's on rank 0's
host address (``GLOO_SOCKET_IFNAME``), and
the rendezvous store on ``MASTER_ADDR`` only (docs/security.md).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import (
    HYPERGRID,
    HostRanksJob,
    layout_rows,
    listening_sockets,
    namespace_processes,
    pid_of_rank,
    read_json,
)
from tests.support.launching import REPO
from tests.support.netns import netns_unavailable

UNAVAILABLE = netns_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no namespace hosts here: {UNAVAILABLE}")

STEPS = 60
RANKS = 6
#: host index of each rank: hydra deals a hostfile of one slot per host round-robin
PLACEMENT = [rank % 2 for rank in range(RANKS)]
ARGS = ["-n", str(RANKS), f"run.steps={STEPS}", "run.log_every=10", "layout.buffers=2", "layout.placement=node-local"]


def _hypergrid_config():
    from gflowdist.config import Config

    return Config.from_yaml(HYPERGRID, overrides=ARGS[2:])


def _gradient_bytes(config) -> int:
    """Bytes of one trainer's float32 gradient: what each host must receive per averaged step."""
    path = REPO / "examples" / "hypergrid" / "hypergrid_gfn.py"
    spec = importlib.util.spec_from_file_location("hypergrid_gfn_for_multihost", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    p = config.params
    env = module.HyperGrid(ndim=int(p["ndim"]), height=int(p["height"]))
    model = module.HyperGridPolicy(env, hidden=int(p["hidden"]), n_layers=int(p["layers"]))
    return 4 * sum(t.numel() for t in model.parameters())


def check_hypergrid_run(run, host_names: list[str]) -> None:
    """What a one-host HyperGrid run shows, plus node-local placement on these hosts."""
    config = _hypergrid_config()
    rows = layout_rows(run)
    finals = read_json(run / "finals.json")
    assert sorted(rows) == list(range(RANKS)) and sorted(map(int, finals)) == list(range(RANKS))
    for rank, row in rows.items():
        assert row["host"] == host_names[PLACEMENT[rank]], f"rank {rank} on {row['host']}"
        assert finals[str(rank)]["host"] == row["host"] and finals[str(rank)]["role"] == row["role"]
    roles = [rows[r]["role"] for r in range(RANKS)]
    assert roles.count("trainer") == 3 and roles.count("buffer") == 2 and roles[-1] == "coordinator"
    buffers = [r for r in range(RANKS) if roles[r] == "buffer"]
    assert {rows[b]["host"] for b in buffers} == set(host_names)  # one buffer on each host
    trainers = [r for r in range(RANKS) if roles[r] == "trainer"]
    for t in trainers:  # node-local: a trainer's buffer is on its own host
        assert rows[int(rows[t]["buffer"])]["host"] == rows[t]["host"], rows
    ledger = read_json(run / "ledger.json")
    produced = STEPS * int(config.params["trajectories_per_step"]) * len(trainers)
    assert ledger["balanced"], ledger
    # writer round_robin admits everything and capacity exceeds the run: nothing is dropped
    assert ledger["totals"]["produced"] == ledger["totals"]["admitted"] == produced
    assert ledger["totals"]["in_flight"] == 0 and ledger["totals"]["dropped"] == 0
    assert sum(finals[str(b)]["replay"]["admitted"] for b in buffers) == produced
    for b in buffers:  # each buffer heard only from its own clients
        clients = {str(t) for t in trainers if int(rows[t]["buffer"]) == b}
        assert set(finals[str(b)]["ledger"]["received_from"]) == clients
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for t in trainers:
        mine = [m for m in metrics if m["rank"] == t]
        assert mine and mine[-1]["step"] == STEPS - 1, f"trainer {t} metrics: {mine[-1:]}"
        for m in mine:
            for key in ("loss", "l1", "log_z"):
                assert math.isfinite(m[key]), m
    assert "Load imbalance" in (run / "report.txt").read_text()
    assert ledger["final_line"].startswith("gflowdist: done") and "ledger balanced" in ledger["final_line"]


def check_bridge_traffic(hs, before, after) -> None:
    """Both hosts hold trainers of the one agent group: each must receive a gradient per step."""
    need = STEPS * _gradient_bytes(_hypergrid_config())
    for host, (rx0, _), (rx1, _) in zip(hs.hosts, before, after, strict=False):
        assert rx1 - rx0 >= need, f"{host.name} received {rx1 - rx0} bytes over its veth, expected >= {need}"


def test_hypergrid_on_two_hosts_with_mpi(netns_hosts, job_factory):
    hs = netns_hosts
    before = [hs.link_bytes(h) for h in hs.hosts]
    # one slot per host in the hostfile: hydra deals ranks 0, 2, 4 to host 0 and 1, 3, 5 to host 1
    job = job_factory(
        *ARGS, f"launch.mpiexec_args={json.dumps(hs.mpiexec_options(1))}", config=HYPERGRID, env=hs.mpi_env()
    )
    # while it trains: what the ranks and mpiexec listen on (docs/security.md)
    running = job.wait_for_metrics(1, timeout=180)
    rank_listeners = {r: listening_sockets(pid_of_rank(running, r)) for r in range(RANKS)}
    mpiexec = [pid for pid in job.processes_left() if Path(f"/proc/{pid}/comm").read_text().strip() == "mpiexec"]
    mpiexec_listeners = listening_sockets(mpiexec[0])
    assert job.wait(240) == 0, job.output
    after = [hs.link_bytes(h) for h in hs.hosts]
    run = job.run_dir()
    check_hypergrid_run(run, [h.name for h in hs.hosts])
    check_bridge_traffic(hs, before, after)
    assert read_json(run / "ledger.json")["final_line"] in job.output
    for rank, listeners in rank_listeners.items():  # UCX over TCP, pinned to the host's interface
        assert listeners and {addr for addr, _ in listeners} == {hs.hosts[PLACEMENT[rank]].ip}, (rank, listeners)
    # hydra publishes its control port on -iface's address but binds it on every address of the launcher
    assert mpiexec_listeners and {addr for addr, _ in mpiexec_listeners} == {"0.0.0.0"}, mpiexec_listeners
    assert job.no_process_left()
    assert namespace_processes(hs) == {h.name: [] for h in hs.hosts}


@pytest.fixture(scope="module")
def torch_run(netns_hosts, tmp_path_factory) -> dict:
    """The torch job, once for the tests below; rank 0's listening sockets are sampled while it runs."""
    hs = netns_hosts
    before = [hs.link_bytes(h) for h in hs.hosts]
    job = HostRanksJob(tmp_path_factory.mktemp("torch"), hs, PLACEMENT, *ARGS[2:], config=HYPERGRID)
    try:
        listening: list[tuple[str, int]] = []
        deadline = time.monotonic() + 120
        while job.procs[0].poll() is None and time.monotonic() < deadline:
            try:
                listening = listening_sockets(job.procs[0].pid)
            except OSError:  # rank 0 is exiting
                break
            if any(port == job.port for _, port in listening) and len(listening) > 1:
                break
            time.sleep(0.05)
        codes = job.wait(240)
        after = [hs.link_bytes(h) for h in hs.hosts]
        return {
            "job": job,
            "codes": codes,
            "output": job.output,
            "before": before,
            "after": after,
            "listening": listening,
            "left": job.processes_left(),
            "in_namespaces": namespace_processes(hs),
        }
    finally:
        job.close()


def test_hypergrid_on_two_hosts_with_torch(netns_hosts, torch_run):
    hs = netns_hosts
    assert torch_run["codes"] == [0] * RANKS, torch_run["output"]
    check_hypergrid_run(torch_run["job"].run_dir(), [h.name for h in hs.hosts])
    check_bridge_traffic(hs, torch_run["before"], torch_run["after"])
    assert torch_run["left"] == []
    assert torch_run["in_namespaces"] == {h.name: [] for h in hs.hosts}


def test_gloo_listens_only_on_the_host_interface(netns_hosts, torch_run):
    """gloo's sockets on rank 0 are bound to the GLOO_SOCKET_IFNAME address (docs/security.md)."""
    listening, port = torch_run["listening"], torch_run["job"].port
    assert any(p == port for _, p in listening), f"the rendezvous store was not seen: {listening}"
    others = [addr for addr, p in listening if p != port]
    assert others and set(others) == {netns_hosts.hosts[0].ip}, listening


def test_rendezvous_store_listens_only_on_master_addr(netns_hosts, torch_run):
    """gflowdist binds the store's socket to MASTER_ADDR itself (gflowdist.comm.rendezvous)."""
    store = [addr for addr, p in torch_run["listening"] if p == torch_run["job"].port]
    assert store and set(store) == {netns_hosts.hosts[0].ip}, torch_run["listening"]
