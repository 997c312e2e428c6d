"""gflowdist.comm.rendezvous: the store listens on MASTER_ADDR only, and its failures name the address.

The two-process tests start gloo jobs on loopback (``MASTER_ADDR=127.0.0.1``)
and read rank 0's listening sockets from ``/proc`` while the group exists.
The same probe on torch's own ``env://`` rendezvous sees the wildcard, so the
check tells the two apart. The error tests run in this process: each fails
before any process group exists.
"""

from __future__ import annotations

import errno
import json
import re
import socket
import sys
from datetime import timedelta

import pytest

from tests.support.launching import REPO, free_port, run_torch

pytest.importorskip("torch")

MARK = "LISTENING "
#: the rendezvous of each phase of the job, in order
PHASES = [("gflowdist", "1"), ("gflowdist", "0"), ("torch", "1")]

#: one job, three process groups in turn (gflowdist with the libuv store, gflowdist with the
#: classic store, torch's env://), each on its own port; rank 0 prints its listening sockets
PROGRAM = f"""
import json, os, sys
import torch.distributed as dist
from tests.support.jobs import listening_sockets
from gflowdist.comm.select import release_world_comm, world_comm
for (how, use_libuv), port in zip({PHASES!r}, sys.argv[1:]):
    os.environ.update(MASTER_PORT=port, USE_LIBUV=use_libuv)
    if how == "gflowdist":
        world_comm("torch")
    else:
        dist.init_process_group("gloo", init_method="env://")
    if dist.get_rank() == 0:
        print({MARK!r} + json.dumps([how, use_libuv, int(port), listening_sockets(os.getpid())]), flush=True)
    dist.barrier()
    if how == "gflowdist":
        release_world_comm()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def store_listeners(tmp_path_factory) -> dict[tuple[str, str], list[str]]:
    """``(rendezvous, USE_LIBUV) -> addresses rank 0 listened on at the store's port``."""
    script = tmp_path_factory.mktemp("rendezvous") / "listen.py"
    script.write_text(PROGRAM)
    ports = [str(free_port()) for _ in PHASES]
    # the program imports tests.support.jobs: the repository on its PYTHONPATH
    result = run_torch(2, [sys.executable, str(script), *ports], timeout=90, env={"PYTHONPATH": str(REPO)}).check()
    found = {}
    for line in result.output.splitlines():
        if line.startswith(MARK):
            how, use_libuv, port, listening = json.loads(line[len(MARK) :])
            found[how, use_libuv] = [addr for addr, p in listening if p == port]
    assert sorted(found) == sorted(PHASES), result.output
    return found


@pytest.mark.parametrize("use_libuv", ["1", "0"], ids=["libuv-store", "classic-store"])
def test_store_listens_on_master_addr_only(store_listeners, use_libuv):
    assert store_listeners["gflowdist", use_libuv] == ["127.0.0.1"], store_listeners


def test_torch_env_rendezvous_listens_on_every_address(store_listeners):
    """The contrast: torch's own env:// store is on the wildcard, whatever MASTER_ADDR says."""
    store = store_listeners["torch", "1"]
    assert store and set(store) <= {"::", "0.0.0.0"}, store_listeners


@pytest.fixture
def torch_env(monkeypatch):
    """Rank 0 of a world of 2 on a free loopback port; nothing initialised."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    yield port
    assert not dist.is_initialized()


def test_master_addr_of_another_host_is_a_config_error(torch_env, monkeypatch):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    foreign = _foreign_address()
    monkeypatch.setenv("MASTER_ADDR", foreign)
    with pytest.raises(
        ConfigError, match=rf"MASTER_ADDR: '{re.escape(foreign)}' is not an address of this host"
    ) as info:
        init_default_group("gloo", timeout=timedelta(seconds=5))
    assert info.value.key == "MASTER_ADDR"


def _foreign_address() -> str:
    """A documentation address (RFC 5737) that this host does not have: binding it fails."""
    for candidate in ("203.0.113.7", "198.51.100.7", "192.0.2.77"):
        with socket.socket() as s:
            try:
                s.bind((candidate, 0))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    return candidate
    pytest.skip("every candidate documentation address is assigned to this host")


def test_master_addr_that_does_not_resolve_is_a_config_error(torch_env, monkeypatch):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")  # .invalid never resolves (RFC 2606)
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(ConfigError, match="does not resolve") as info:
            init_default_group("gloo", timeout=timedelta(seconds=5))
        assert info.value.key == "MASTER_ADDR"


@pytest.mark.parametrize("port", ["", "0", "65536", "http"])
def test_bad_master_port_is_a_config_error(torch_env, monkeypatch, port):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    monkeypatch.setenv("MASTER_PORT", port)
    with pytest.raises(ConfigError, match="is not a port") as info:
        init_default_group("gloo")
    assert info.value.key == "MASTER_PORT"


def test_master_port_in_use_is_a_config_error(torch_env):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    with socket.create_server(("127.0.0.1", torch_env)):
        with pytest.raises(ConfigError, match=f"port {torch_env} is already in use on 127.0.0.1") as info:
            init_default_group("gloo", timeout=timedelta(seconds=5))
    assert info.value.key == "MASTER_PORT"


def test_rank_outside_the_world_is_a_config_error(torch_env, monkeypatch):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match="rank 2 is outside a world of 2"):
        init_default_group("gloo")


def test_client_without_a_store_gets_a_deadline_naming_the_address(torch_env, monkeypatch):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import DeadlineError

    monkeypatch.setenv("RANK", "1")  # nobody serves the store on this port
    with pytest.raises(
        DeadlineError,
        match=rf"rank 1: the rendezvous store at 127\.0\.0\.1:{torch_env} "
        r"\(MASTER_ADDR:MASTER_PORT\) did not answer within 1 s",
    ) as info:
        init_default_group("gloo", timeout=timedelta(seconds=1))
    assert info.value.peer == 0


def test_store_without_its_clients_gets_a_deadline_and_frees_the_port(torch_env):
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import DeadlineError

    with pytest.raises(
        DeadlineError,
        match=rf"rank 0: not every one of the 2 ranks reached the rendezvous store at "
        rf"127\.0\.0\.1:{torch_env}",
    ):
        init_default_group("gloo", timeout=timedelta(seconds=1))
    with socket.create_server(("127.0.0.1", torch_env)):  # the store closed the socket it was handed
        pass


def test_tcp_url_needs_rank_and_world_size():
    from gflowdist.comm.rendezvous import init_default_group
    from gflowdist.errors import ConfigError

    with pytest.raises(ConfigError, match="needs rank and world_size") as info:
        init_default_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}")
    assert info.value.key == "init_method"


def test_torchgfn_mpi_rendezvous_refuses_a_loopback_only_host_name():
    """On several hosts the store is bound to the address published; a loopback one would be unreachable."""
    from gflowdist.comm.rendezvous import reachable_address
    from gflowdist.errors import ConfigError

    with pytest.raises(ConfigError, match="'localhost' resolves only to loopback addresses"):
        reachable_address("localhost")
