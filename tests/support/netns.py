"""Several "hosts" on one Linux machine: network namespaces joined by a bridge.

A :class:`HostSet` of ``n`` hosts is, for a tag ``T = gfn<pid><letter>``::

    root namespace                     namespace T h0          namespace T h1
    bridge Tbr  10.a.b.1/24  ──port──  Tv0 ═veth═ gfdnet0 10.a.b.2/24, lo
                             ──port──  Tv1 ═veth═ gfdnet0 10.a.b.3/24, lo  ...

* host ``i`` is the network namespace ``Thi``; its host name is the same string
  (commands run in a fresh UTS namespace through
  ``tests/netns/launch-into-netns.sh``, which sets it);
* inside every host the interface is called :data:`IFNAME` (like ``eth0`` on
  every node of a cluster) and carries address ``subnet[i + 2]``; the bridge
  itself has ``subnet[1]`` so that ``mpiexec`` in the root namespace is
  reachable from the hosts;
* ``10.a.b.0/24`` is drawn at random and rejected if it overlaps any route or
  address of the root namespace; hosts have no default route, so nothing
  leaves the set: traffic stays on loopback, the bridge and its veths;
* ``/etc/netns/Thi/hosts`` maps every host name of the set to its address
  (``ip netns exec`` bind-mounts it over ``/etc/hosts``);
* IPv6 is off on every interface of the set: IPv4 only, no stray
  neighbour-discovery traffic in the byte counters.

Teardown (context exit, exception, ``atexit``, SIGTERM) kills every process
inside the namespaces, deletes the namespaces, veths and bridge and removes
``/etc/netns/Thi``. A set whose pid is dead (a run that was SIGKILLed) is
removed by :func:`cleanup_stale` before every new set is made.

MPI jobs go through hydra's ssh launcher (:meth:`HostSet.mpiexec_options`);
torch jobs run one process per host (:meth:`HostSet.run_torch`). See
docs/multi-host-testing.md for why each flag is needed.

Command line (a persistent set for experiments by hand)::

    python -m tests.support.netns up [--hosts N]   # prints the mpiexec / torch command lines
    python -m tests.support.netns down
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import ipaddress
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gflowdist.process_tree import is_running
from tests.support.launching import REPO, JobResult, base_env, find_mpiexec, free_port, run_mpi

#: the ssh stand-in hydra (and :meth:`HostSet.exec_argv`) uses to enter a host
LAUNCHER = REPO / "tests" / "netns" / "launch-into-netns.sh"
#: interface name inside every host (the namespace end of its veth pair)
IFNAME = "gfdnet0"
#: every name this module creates starts with it
PREFIX = "gfn"
#: tag of the persistent set made by ``python -m tests.support.netns up``; never removed as stale
MANUAL_TAG = PREFIX + "man"
#: a name made by a test run: its tag (PREFIX, creator pid, set letter), then what it is
_RUN_NAME = re.compile(rf"^(?P<tag>{PREFIX}(?P<pid>\d+)[a-z])(?:br|v\d+|h\d+|-files)$")
_NETNS_DIR = Path("/var/run/netns")
_ETC_NETNS = Path("/etc/netns")
#: Seconds a new set's links get to carry a first TCP connection.
_LINK_UP_S = 10.0
_LOCK = Path("/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()) / "gflowdist-netns.lock"
_CAPS = {"CAP_SYS_ADMIN": 21, "CAP_NET_ADMIN": 12}
_CLONE_NEWNET = 0x40000000


class NetnsError(RuntimeError):
    """A namespace host set could not be made, used or removed; says which command failed."""


@dataclass(frozen=True)
class Host:
    """One namespace "host": ``name`` is both its namespace and its host name."""

    name: str
    ip: str
    #: the bridge-side end of its veth pair (root namespace); ``ip link set veth down`` cuts the host off
    veth: str


@dataclass
class HostSet:
    """``n`` hosts on one bridge; build it with :func:`hosts`, never by hand."""

    tag: str
    subnet: ipaddress.IPv4Network
    bridge: str
    bridge_ip: str
    hosts: tuple[Host, ...]

    @property
    def workdir(self) -> Path:
        """A directory for the set's files (hostfiles); removed with the set."""
        path = _workdir(self.tag)
        path.mkdir(exist_ok=True)
        return path

    def host(self, key: int | str) -> Host:
        """A host by index or by name."""
        if isinstance(key, int):
            return self.hosts[key]
        for h in self.hosts:
            if h.name == key:
                return h
        raise NetnsError(f"no host named {key!r} in {self.tag} (hosts: {[h.name for h in self.hosts]})")

    # ---- running commands on the hosts -------------------------------------------------------

    def exec_argv(self, host: Host | int | str, argv: list[str]) -> list[str]:
        """The argv that runs ``argv`` on ``host`` (its netns, its host name), as hydra would."""
        return [str(LAUNCHER), self._host(host).name, shlex.join(argv)]

    def hostfile(self, ranks_per_host: int | list[int]) -> Path:
        """Write ``name:slots`` lines (hydra fills host 0's slots first) and return the path."""
        counts = self._counts(ranks_per_host)
        path = self.workdir / ("hosts-" + "-".join(map(str, counts)))
        path.write_text("".join(f"{h.name}:{c}\n" for h, c in zip(self.hosts, counts, strict=False) if c))
        return path

    def mpiexec_options(self, ranks_per_host: int | list[int]) -> list[str]:
        """hydra options that place the ranks on the hosts (see docs/multi-host-testing.md).

        ``-launcher ssh -launcher-exec LAUNCHER``: start each host's proxy through
        the ssh stand-in; ``-f``: the hostfile; ``-iface BRIDGE``: publish the
        control port on the bridge address (the default, the root host name,
        resolves to 127.0.0.1, which inside a host is the host itself).
        """
        return [
            "-launcher",
            "ssh",
            "-launcher-exec",
            str(LAUNCHER),
            "-f",
            str(self.hostfile(ranks_per_host)),
            "-iface",
            self.bridge,
        ]

    def mpi_env(self) -> dict[str, str]:
        """Environment for the ranks: UCX over TCP on :data:`IFNAME` only.

        Without ``UCX_TLS=tcp,self`` UCX sees one machine and moves the data
        between hosts through SysV shared memory and CMA: nothing crosses the
        bridge and cutting a link changes nothing.
        """
        return {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": IFNAME}

    def torch_env(self, rank: int, port: int) -> dict[str, str]:
        """env:// rendezvous at host 0; gloo pinned to :data:`IFNAME`."""
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(self.hosts)),
            "LOCAL_RANK": "0",
            "MASTER_ADDR": self.hosts[0].ip,
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": IFNAME,
        }

    def run_mpi(
        self,
        ranks_per_host: int | list[int],
        argv: list[str],
        *,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ) -> JobResult:
        """``mpiexec`` with the ranks spread over the hosts; every process is killed at the end.

        hydra gives each proxy and rank a session of its own, so killing
        mpiexec's process group is not enough: every process left in the
        namespaces is killed too (run one job at a time per set).
        """
        total = sum(self._counts(ranks_per_host))
        try:
            return run_mpi(
                total,
                self.mpiexec_options(ranks_per_host) + argv,
                timeout=timeout,
                env={**self.mpi_env(), **(env or {})},
            )
        finally:
            self.kill_processes()

    def run_torch(self, argv: list[str], *, timeout: float = 120, env: dict[str, str] | None = None) -> JobResult:
        """One process per host with :meth:`torch_env`; if one fails the others are killed."""
        port = free_port()
        procs: list[subprocess.Popen] = []
        logs = []
        try:
            for rank, host in enumerate(self.hosts):
                logs.append(tempfile.TemporaryFile("w+"))
                proc_env = base_env(**(env or {}))
                proc_env.update(self.torch_env(rank, port))
                procs.append(
                    subprocess.Popen(
                        self.exec_argv(host, argv),
                        stdout=logs[-1],
                        stderr=subprocess.STDOUT,
                        text=True,
                        env=proc_env,
                        cwd=REPO,
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                if any(p.poll() not in (None, 0) for p in procs):
                    break
                time.sleep(0.05)
            timed_out = any(p.poll() is None for p in procs) and time.monotonic() >= deadline
            self.kill_processes()
            codes = [p.wait() for p in procs]
            output = []
            for rank, (host, log) in enumerate(zip(self.hosts, logs, strict=False)):
                log.seek(0)
                output.append(f"----- rank {rank} on {host.name} (exit {codes[rank]}) -----\n{log.read()}")
            return JobResult(next((c for c in codes if c != 0), 0), "\n".join(output), timed_out)
        finally:
            self.kill_processes()
            for log in logs:
                log.close()

    def kill_processes(self) -> None:
        """SIGKILL every process inside the set's namespaces and wait until they are gone."""
        _kill_in_namespaces([h.name for h in self.hosts])

    # ---- the network ---------------------------------------------------------------------------

    def cut_link(self, host: Host | int | str) -> None:
        """Pull the host's cable: its bridge-side veth goes down; packets to and from it are lost."""
        _ip("link", "set", self._host(host).veth, "down")

    def restore_link(self, host: Host | int | str, *, deadline: float = 5.0) -> None:
        """Plug the cable back and wait (up to ``deadline`` s) until the bridge reaches the host."""
        h = self._host(host)
        _ip("link", "set", h.veth, "up")
        stop = time.monotonic() + deadline
        while not self.can_reach(None, h, timeout=0.5):
            if time.monotonic() > stop:
                raise NetnsError(f"{h.name} ({h.ip}) still unreachable {deadline} s after 'ip link set {h.veth} up'")
            time.sleep(0.05)

    @contextmanager
    def link_cut(self, host: Host | int | str) -> Iterator[Host]:
        """``with hs.link_cut(1): ...`` -- the host is cut off inside the block, restored after."""
        h = self._host(host)
        self.cut_link(h)
        try:
            yield h
        finally:
            self.restore_link(h)

    def can_reach(self, src: Host | int | str | None, dst: Host | int | str | None, *, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from ``src`` to ``dst`` opens within ``timeout`` s.

        ``None`` is the root namespace (the bridge address). The sockets are
        made in threads that joined the namespaces, so no process is started.
        """
        src_ns = None if src is None else self._host(src).name
        dst_ns, dst_ip = (None, self.bridge_ip) if dst is None else (self._host(dst).name, self._host(dst).ip)
        with _socket_in(dst_ns) as listener, _socket_in(src_ns) as client:
            listener.bind((dst_ip, 0))
            listener.listen(1)
            client.settimeout(timeout)
            try:
                client.connect(listener.getsockname())
            except OSError:  # timeout, EHOSTUNREACH, ENETUNREACH: not reachable
                return False
            return True

    def link_bytes(self, host: Host | int | str) -> tuple[int, int]:
        """(bytes received by the host, bytes sent by it) so far, from its veth's counters."""
        stats = Path("/sys/class/net") / self._host(host).veth / "statistics"
        # the bridge-side end transmits what the host receives and vice versa
        return int((stats / "tx_bytes").read_text()), int((stats / "rx_bytes").read_text())

    # ---- internals -----------------------------------------------------------------------------

    def _host(self, host: Host | int | str) -> Host:
        return host if isinstance(host, Host) else self.host(host)

    def _counts(self, ranks_per_host: int | list[int]) -> list[int]:
        counts = [ranks_per_host] * len(self.hosts) if isinstance(ranks_per_host, int) else list(ranks_per_host)
        if len(counts) != len(self.hosts) or min(counts) < 0 or sum(counts) == 0:
            raise NetnsError(f"ranks per host {ranks_per_host!r} does not fit {len(self.hosts)} hosts")
        return counts


# ---- availability ------------------------------------------------------------------------------


def missing_caps(cap_eff_hex: str) -> list[str]:
    """Capabilities the fixture needs that the ``CapEff`` mask (hex, /proc/self/status) lacks."""
    mask = int(cap_eff_hex, 16)
    return [name for name, bit in _CAPS.items() if not mask >> bit & 1]


def netns_unavailable() -> str | None:
    """Why this machine cannot make namespace hosts, or ``None`` if it can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux, this is {sys.platform}"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (package {package})"
    status = Path("/proc/self/status").read_text()
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.M)
    missing = missing_caps(match.group(1)) if match else list(_CAPS)
    if missing:
        return f"creating network namespaces needs {' and '.join(missing)} (run as root)"
    trial = subprocess.run(["unshare", "--net", "--uts", "true"], capture_output=True, text=True)
    if trial.returncode != 0:
        return f"'unshare --net --uts' fails here: {trial.stderr.strip()}"
    return None


# ---- making and removing sets ------------------------------------------------------------------

_LIVE: dict[str, HostSet] = {}
_next_letter = iter("abcdefghijklmnopqrstuvwxyz")


@contextmanager
def hosts(n: int = 2) -> Iterator[HostSet]:
    """``n`` (1-9) namespace hosts on a bridge; everything is removed on exit, however it happens."""
    try:
        tag = f"{PREFIX}{os.getpid()}{next(_next_letter)}"
    except StopIteration:
        raise NetnsError("more than 26 namespace host sets in one process") from None
    try:
        yield create(tag, n)
    finally:
        destroy(tag)


def create(tag: str, n: int) -> HostSet:
    """Make the set ``tag`` (after removing stale sets); :func:`destroy` undoes it."""
    if not 1 <= n <= 9:
        raise NetnsError(f"a host set has 1 to 9 hosts, not {n}")
    with _locked():
        _cleanup_stale()
        subnet = _free_subnet()
        bridge, bridge_ip = f"{tag}br", str(subnet[1])
        members = tuple(Host(f"{tag}h{i}", str(subnet[i + 2]), f"{tag}v{i}") for i in range(n))
        hs = HostSet(tag, subnet, bridge, bridge_ip, members)
        _LIVE[tag] = hs
        _install_sigterm_handler()
        try:
            _build(hs)
        except BaseException:
            destroy(tag)
            raise
    return hs


def _build(hs: HostSet) -> None:
    """Create the bridge, the namespaces, their veths, addresses and hosts files; probe the links."""
    prefix = hs.subnet.prefixlen
    _ip("link", "add", hs.bridge, "type", "bridge", "forward_delay", "0")
    _no_ipv6(hs.bridge)
    _ip("addr", "add", f"{hs.bridge_ip}/{prefix}", "dev", hs.bridge)
    _ip("link", "set", hs.bridge, "up")
    hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.ip} {h.name}\n" for h in hs.hosts)
    for h in hs.hosts:
        _ip("netns", "add", h.name)
        _run(
            [
                "ip",
                "netns",
                "exec",
                h.name,
                "sh",
                "-c",
                "for f in /proc/sys/net/ipv6/conf/all /proc/sys/net/ipv6/conf/default; do "
                "[ ! -e $f ] || echo 1 > $f/disable_ipv6; done",
            ]
        )
        _ip("link", "add", h.veth, "type", "veth", "peer", "name", IFNAME, "netns", h.name)
        _no_ipv6(h.veth)
        _ip("link", "set", h.veth, "master", hs.bridge)
        _ip("link", "set", h.veth, "up")
        _ip("-n", h.name, "addr", "add", f"{h.ip}/{prefix}", "dev", IFNAME)
        _ip("-n", h.name, "link", "set", IFNAME, "up")
        _ip("-n", h.name, "link", "set", "lo", "up")
        (_ETC_NETNS / h.name).mkdir(parents=True, exist_ok=True)
        (_ETC_NETNS / h.name / "hosts").write_text(hosts_file)
    for i, h in enumerate(hs.hosts):
        peer = hs.hosts[(i + 1) % len(hs.hosts)]
        for target in [None] + ([peer] if peer != h else []):
            if not _reachable_soon(hs, h, target):
                where = f"the bridge {hs.bridge_ip}" if target is None else f"{target.name} ({target.ip})"
                raise NetnsError(
                    f"{h.name} cannot open a TCP connection to {where} over {hs.bridge}: "
                    "is bridged traffic filtered (br_netfilter + iptables FORWARD)?"
                )


def _reachable_soon(hs: HostSet, src: Host, dst: Host | None, within_s: float = _LINK_UP_S) -> bool:
    """Whether ``src`` reaches ``dst`` within ``within_s``, connecting again after each failure.

    A veth's carrier comes up asynchronously after ``ip link set up``: a SYN
    sent before it is lost, and the kernel sends the next one only a second
    later, so one connect with a 1 s timeout fails now and then on a busy
    machine while the link is fine.
    """
    deadline = time.monotonic() + within_s
    while True:
        if hs.can_reach(src, dst, timeout=min(1.0, max(0.1, deadline - time.monotonic()))):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def destroy(tag: str) -> None:
    """Kill the processes of set ``tag`` and remove its namespaces, links and /etc/netns entries.

    Every step runs even if an earlier one failed; what failed is raised at the end.
    """
    _LIVE.pop(tag, None)
    if not _LIVE:
        _restore_sigterm_handler()
    namespaces, links, etc_dirs = _names_of(tag)
    errors = []
    try:
        _kill_in_namespaces(namespaces)
    except NetnsError as exc:
        errors.append(str(exc))
    for cmd in [["netns", "del", ns] for ns in namespaces] + [["link", "del", link] for link in links]:
        result = subprocess.run(["ip", *cmd], capture_output=True, text=True)
        # a veth vanishes with its namespace peer: "Cannot find device" is the goal, not an error
        if result.returncode != 0 and "Cannot find device" not in result.stderr:
            errors.append(f"ip {' '.join(cmd)}: {result.stderr.strip()}")
    for path in [*etc_dirs, _workdir(tag)]:
        shutil.rmtree(path, ignore_errors=True)
    left = leftovers(tag)
    if errors or left:
        raise NetnsError(f"removing host set {tag} failed: {errors}; left behind: {left}")


def leftovers(tag: str) -> list[str]:
    """Every namespace, link, /etc/netns entry and work directory of set ``tag`` that exists."""
    workdir = [str(_workdir(tag))] if _workdir(tag).exists() else []
    return [name for group in _names_of(tag) for name in group] + workdir


def cleanup_stale() -> list[str]:
    """Destroy every run set whose creating pid is dead; returns their tags.

    Holds the lock that :func:`create` holds, so that it never removes a set
    another process is building.
    """
    with _locked():
        return _cleanup_stale()


def _cleanup_stale() -> list[str]:
    tags = set()
    workdirs = [str(p) for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-files")]
    for name in _namespaces() + _links() + _etc_dirs() + workdirs:
        match = _RUN_NAME.match(Path(name).name)
        if match and not is_running(int(match["pid"])):
            tags.add(match["tag"])
    for tag in sorted(tags):
        destroy(tag)
    return sorted(tags)


@pytest.fixture(scope="module")
def netns_hosts() -> Iterator[HostSet]:
    """Two namespace hosts for a test module; skipped only where namespaces cannot be made."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    with hosts(2) as hs:
        yield hs


# ---- helpers ----------------------------------------------------------------------------------


def _run(cmd: list[str]) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetnsError(f"'{shlex.join(cmd)}' failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _no_ipv6(link: str) -> None:
    knob = Path("/proc/sys/net/ipv6/conf") / link / "disable_ipv6"
    if knob.exists():
        knob.write_text("1")


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _links() -> list[str]:
    return [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()]


def _etc_dirs() -> list[str]:
    return [str(p) for p in _ETC_NETNS.iterdir()] if _ETC_NETNS.is_dir() else []


def _workdir(tag: str) -> Path:
    return Path(tempfile.gettempdir()) / f"{tag}-files"


def _names_of(tag: str) -> tuple[list[str], list[str], list[str]]:
    """(namespaces, root-namespace links, /etc/netns dirs) that belong to set ``tag``."""
    own_ns = re.compile(rf"^{re.escape(tag)}h\d+$")
    own_link = re.compile(rf"^{re.escape(tag)}(?:br|v\d+)$")
    return (
        [ns for ns in _namespaces() if own_ns.match(ns)],
        [link for link in _links() if own_link.match(link)],
        [d for d in _etc_dirs() if own_ns.match(Path(d).name)],
    )


def _kill_in_namespaces(namespaces: list[str], wait: float = 5.0) -> None:
    stop = time.monotonic() + wait
    while True:
        pids = [int(p) for ns in namespaces if (_NETNS_DIR / ns).exists() for p in _ip("netns", "pids", ns).split()]
        if not pids:
            return
        if time.monotonic() > stop:
            raise NetnsError(f"processes {pids} in {namespaces} survive SIGKILL for {wait} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)


def _free_subnet() -> ipaddress.IPv4Network:
    """A random 10.a.b.0/24 that overlaps no route or address of the root namespace."""
    used = []
    for line in _ip("-4", "route", "show", "table", "all").splitlines() + _ip("-4", "-o", "addr", "show").splitlines():
        for word in line.split():
            if re.match(r"^\d+\.\d+\.\d+\.\d+(/\d+)?$", word):
                used.append(ipaddress.ip_network(word, strict=False))
    rng = random.Random()
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(f"10.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetnsError(f"no free 10.x.y.0/24 subnet in 1000 draws; routes in use: {sorted(map(str, used))[:20]}")


@contextmanager
def _locked() -> Iterator[None]:
    """Serialise set creation and stale cleanup between processes (subnet choice, names)."""
    with open(_LOCK, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def _socket_in(namespace: str | None) -> Iterator[socket.socket]:
    """A TCP socket created inside ``namespace`` (``None``: this one) by a short-lived thread."""
    made: list[socket.socket] = []
    failed: list[OSError] = []

    def make() -> None:
        try:
            if namespace is not None:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(_NETNS_DIR / namespace, os.O_RDONLY)
                try:
                    if libc.setns(fd, _CLONE_NEWNET) != 0:  # this thread only
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns({namespace}): {os.strerror(err)}")
                finally:
                    os.close(fd)
            made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=make, name=f"netns-{namespace}")
    thread.start()
    thread.join()
    if failed:
        raise NetnsError(f"cannot open a socket in namespace {namespace}: {failed[0]}")
    try:
        yield made[0]
    finally:
        made[0].close()


def _atexit_destroy() -> None:
    for tag in list(_LIVE):
        destroy(tag)


def _sigterm_interrupts(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum} while namespace hosts {sorted(_LIVE)} exist")


def _install_sigterm_handler() -> None:
    """While sets exist, SIGTERM interrupts like Ctrl-C: ``finally`` blocks and fixtures remove them.

    (KeyboardInterrupt, not SystemExit: pytest records a SystemExit as a test
    failure and carries on, but stops the session on KeyboardInterrupt.)
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_interrupts)


def _restore_sigterm_handler() -> None:
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is _sigterm_interrupts
    ):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


atexit.register(_atexit_destroy)


# ---- command line -----------------------------------------------------------------------------


def _manual_up(n: int) -> None:
    if leftovers(MANUAL_TAG):
        raise NetnsError(f"a manual set exists already; run 'python {sys.argv[0]} down' first")
    hs = create(MANUAL_TAG, n)
    _LIVE.pop(MANUAL_TAG)  # persistent: not removed at exit
    _restore_sigterm_handler()
    py = sys.executable
    env = " ".join(f"{k}={v}" for k, v in hs.mpi_env().items())
    print("hosts: " + ", ".join(f"{h.name} {h.ip} (cut: ip link set {h.veth} down)" for h in hs.hosts))
    print(f"bridge {hs.bridge} {hs.bridge_ip}/{hs.subnet.prefixlen}")
    print("\nMPI, 2 ranks per host:")
    print(
        f"  {env} {shlex.join([find_mpiexec(), *hs.mpiexec_options(2), '-n', str(2 * n)])} "
        f"{py} -c 'import socket; print(socket.gethostname())'"
    )
    port = free_port()
    print("\ntorch, one process per host (run each line in its own shell):")
    for rank, h in enumerate(hs.hosts):
        torch_env = " ".join(f"{k}={v}" for k, v in hs.torch_env(rank, port).items())
        print(f"  {torch_env} {shlex.join(hs.exec_argv(h, [py, 'your_script.py']))}")
    print(f"\na shell on a host: {shlex.join(hs.exec_argv(hs.hosts[0], ['bash']))}")
    print(f"remove it all:     {py} {sys.argv[0]} down")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A persistent set of namespace hosts for experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="create the hosts and print the command lines to use")
    up.add_argument("--hosts", type=int, default=2, help="number of hosts (1-9, default 2)")
    sub.add_parser("down", help="remove the hosts")
    args = parser.parse_args(argv)
    reason = netns_unavailable()
    if reason:
        print(f"cannot make namespace hosts: {reason}", file=sys.stderr)
        return 1
    if args.command == "up":
        _manual_up(args.hosts)
    else:
        destroy(MANUAL_TAG)
        print(f"removed {MANUAL_TAG}*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
