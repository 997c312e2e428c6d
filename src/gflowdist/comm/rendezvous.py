"""The torch rendezvous store, listening on the rendezvous address only.

torch's own ``env://`` and ``tcp://`` initialisation lets rank 0's
``TCPStore`` listen on the port on *every* address of its host (``::``,
dual-stack), whatever ``MASTER_ADDR`` says. :func:`init_default_group` does
the same rendezvous with the listening socket made here:

- **rank 0** resolves the address, binds a TCP socket to ``(address, port)``
  (the first resolved address that is one of this host's), listens, and hands
  the socket to ``TCPStore(..., is_master=True, master_listen_fd=fd)``; the
  store owns it from then on (it closes it when it is destroyed, or when its
  constructor fails). Both store backends of torch 2.13 (libuv, the default,
  and the classic one, ``USE_LIBUV=0``) accept the socket.
- **every other rank** connects a client ``TCPStore`` to ``address:port``.
- **under torchrun** (``TORCHELASTIC_USE_AGENT_STORE=True``) the agent
  already serves the store on ``MASTER_ADDR:MASTER_PORT``: every rank,
  rank 0 included, is a client, as with torch's ``env://``.

Then ``init_process_group(backend, store=PrefixStore("default_pg", store),
rank=..., world_size=...)``: the same key prefix torch's ``env://`` uses.

Waiting: rank 0's store waits until all ``world_size`` ranks (itself
included) have connected; a client retries until it connects. Both give up
after ``timeout`` (torch's default process-group timeout when ``None``)
with a :class:`~gflowdist.errors.DeadlineError` naming the address.

Errors before any waiting, as :class:`~gflowdist.errors.ConfigError` naming
the variable (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, or
``init_method`` for a ``tcp://`` URL): a missing or malformed value, an
address that does not resolve, on rank 0 an address that is not one of this
host's (the store could not be reached there), or a port already in use.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gflowdist.errors import ConfigError, DeadlineError, TransportError

if TYPE_CHECKING:  # torch.distributed is imported where a group is made, not when this module loads
    from torch.distributed import Store

__all__ = ["init_default_group", "bind_listener", "reachable_address"]

log = logging.getLogger("gflowdist.comm")


@dataclass(frozen=True)
class _Rendezvous:
    """Where the store is and who this process is; ``*_key`` name the source of each value in errors."""

    host: str
    port: int
    rank: int
    world_size: int
    host_key: str
    port_key: str

    @property
    def where(self) -> str:
        return (
            f"{self.host}:{self.port} ({self.host_key}:{self.port_key})"
            if self.host_key != self.port_key
            else f"{self.host}:{self.port} ({self.host_key})"
        )


def init_default_group(
    backend: str,
    *,
    timeout: timedelta | None = None,
    init_method: str = "env://",
    rank: int | None = None,
    world_size: int | None = None,
) -> None:
    """Initialise torch's default process group with a store listening on the rendezvous address only.

    ``init_method``:

    - ``"env://"``: the store at ``MASTER_ADDR:MASTER_PORT``; ``rank`` and
      ``world_size`` default to ``RANK`` and ``WORLD_SIZE``.
    - ``"tcp://host:port"``: the store at that address; ``rank`` and
      ``world_size`` are required.
    - anything else (``file://...``): handed to torch unchanged (no socket
      listens for such a rendezvous).

    ``timeout`` bounds the rendezvous and is the process group's timeout
    (``None``: torch's defaults). See the module docstring for what listens
    where and which error each failure raises. A gloo group made here that
    is still there when the process exits normally is destroyed then
    (:func:`gflowdist.comm.session.made_default_group`).
    """
    import torch.distributed as dist

    from gflowdist.comm.session import made_default_group

    extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if init_method == "env://":
        where = _from_environment(rank, world_size)
    elif urlsplit(init_method).scheme == "tcp":
        where = _from_url(init_method, rank, world_size)
    else:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=-1 if rank is None else rank,
            world_size=-1 if world_size is None else world_size,
            **extra,
        )
        made_default_group()
        return
    store = _store(where, timeout if timeout is not None else _default_timeout())
    dist.init_process_group(
        backend, store=dist.PrefixStore("default_pg", store), rank=where.rank, world_size=where.world_size, **extra
    )
    made_default_group()


def bind_listener(
    host: str, port: int, *, host_key: str = "MASTER_ADDR", port_key: str = "MASTER_PORT"
) -> socket.socket:
    """A listening TCP socket on ``(host, port)``: the first address ``host`` resolves to that is this host's.

    Raises :class:`ConfigError` (naming ``host_key``) when ``host`` does not
    resolve or none of its addresses is one of this host's, and naming
    ``port_key`` when the port is in use there.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ConfigError(f"{host!r} does not resolve on {socket.gethostname()}: {exc.strerror}", key=host_key) from exc
    foreign: list[str] = []
    for family, kind, proto, _, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(socket.SOMAXCONN)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRNOTAVAIL:
                foreign.append(str(sockaddr[0]))
                continue
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} is already in use on {sockaddr[0]} (another job, or a store this "
                    "process still holds); pick a free port",
                    key=port_key,
                ) from exc
            raise TransportError(
                f"cannot listen on {sockaddr[0]}:{port} ({host_key}:{port_key}): {exc.strerror}"
            ) from exc
        return sock
    resolved = f"{host!r}" if foreign == [host] else f"{host!r} (resolves to {', '.join(dict.fromkeys(foreign))})"
    raise ConfigError(
        f"{resolved} is not an address of this host ({socket.gethostname()}), which runs rank 0 and "
        "so serves the rendezvous store there; set it to an address of rank 0's host that the "
        "other ranks can reach",
        key=host_key,
    )


def reachable_address(hostname: str) -> str:
    """The first address ``hostname`` resolves to that is not a loopback address (what other hosts can reach)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"rank 0's host name {hostname!r} does not resolve: {exc.strerror}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            return address
    raise ConfigError(
        f"rank 0's host name {hostname!r} resolves only to loopback addresses "
        f"({', '.join(addresses)}), which the other hosts cannot reach"
    )


def _store(where: _Rendezvous, timeout: timedelta) -> Store:
    """The ``TCPStore`` of this rank: the server on rank 0 (unless torchrun's agent serves it), else a client."""
    import torch.distributed as dist

    use_libuv = os.environ.get("USE_LIBUV", "1") == "1"  # the switch torch's env:// reads
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    seconds = timeout.total_seconds()
    if where.rank == 0 and not agent_store:
        listener = bind_listener(where.host, where.port, host_key=where.host_key, port_key=where.port_key)
        bound = listener.getsockname()[0]
        log.debug("rendezvous store listening on %s:%d only", bound, where.port)
        fd = listener.detach()  # the store owns the socket from here on, failure included
        try:
            return dist.TCPStore(
                bound,
                where.port,
                where.world_size,
                True,
                timeout,
                wait_for_workers=True,
                multi_tenant=False,
                master_listen_fd=fd,
                use_libuv=use_libuv,
            )
        except dist.DistError as exc:
            if _timed_out(exc):
                raise DeadlineError(
                    f"rank 0: not every one of the {where.world_size} ranks reached the rendezvous "
                    f"store at {where.where} within {seconds:g} s: {exc}"
                ) from exc
            raise TransportError(f"rank 0: the rendezvous store at {where.where} failed: {exc}") from exc
    try:
        socket.getaddrinfo(where.host, where.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(
            f"{where.host!r} does not resolve on {socket.gethostname()}: {exc.strerror}", key=where.host_key
        ) from exc
    try:
        return dist.TCPStore(where.host, where.port, where.world_size, False, timeout, use_libuv=use_libuv)
    except dist.DistError as exc:
        hint = (
            "is rank 0 running, is that an address of rank 0's host (the store listens on that address "
            "only), and can this host reach it?"
        )
        if _timed_out(exc):
            raise DeadlineError(
                f"rank {where.rank}: the rendezvous store at {where.where} did not answer within "
                f"{seconds:g} s: {hint} ({exc})",
                peer=0,
            ) from exc
        raise TransportError(
            f"rank {where.rank}: cannot reach the rendezvous store at {where.where}: {hint} ({exc})", peer=0
        ) from exc


def _timed_out(exc: Exception) -> bool:
    return "timed out" in str(exc).lower()


def _default_timeout() -> timedelta:
    from torch.distributed.constants import default_pg_timeout

    return default_pg_timeout


def _from_environment(rank: int | None, world_size: int | None) -> _Rendezvous:
    host = os.environ.get("MASTER_ADDR", "")
    if not host:
        raise ConfigError(
            "not set: the address of rank 0's host, where the rendezvous store listens", key="MASTER_ADDR"
        )
    port = _port(os.environ.get("MASTER_PORT", ""), "MASTER_PORT")
    world = world_size if world_size is not None else _count(os.environ.get("WORLD_SIZE", ""), "WORLD_SIZE", 1)
    me = rank if rank is not None else _count(os.environ.get("RANK", ""), "RANK", 0)
    _check_rank(me, world, "RANK")
    return _Rendezvous(host, port, me, world, "MASTER_ADDR", "MASTER_PORT")


def _from_url(url: str, rank: int | None, world_size: int | None) -> _Rendezvous:
    parts = urlsplit(url)
    try:
        port_text = "" if parts.port is None else str(parts.port)
    except ValueError as exc:
        raise ConfigError(f"{url!r}: {exc}", key="init_method") from exc
    if not parts.hostname:
        raise ConfigError(f"{url!r}: expected tcp://<address of rank 0's host>:<port>", key="init_method")
    if rank is None or world_size is None:
        raise ConfigError(f"{url!r}: a tcp:// rendezvous needs rank and world_size", key="init_method")
    _check_rank(rank, world_size, "init_method")
    return _Rendezvous(parts.hostname, _port(port_text, "init_method"), rank, world_size, "init_method", "init_method")


def _port(text: str, key: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 2**16:
        raise ConfigError(
            f"{text!r} is not a port: expected an integer in [1, 65535] on which rank 0's host "
            "serves the rendezvous store",
            key=key,
        )
    return int(text)


def _count(text: str, key: str, low: int) -> int:
    if not text.isdigit() or int(text) < low:
        raise ConfigError(f"{text!r}: expected an integer >= {low}", key=key)
    return int(text)


def _check_rank(rank: int, world_size: int, key: str) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside a world of {world_size}", key=key)
