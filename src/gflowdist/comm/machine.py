"""Which machine this process runs on, as the kernel says (shared by the processes that share its cores)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["boot_id", "machine_key"]


def boot_id() -> str:
    """The kernel this process runs on (processes with the same one share its cores); unique to this process
    where there is no ``/proc`` (not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return f"unknown-{os.getpid()}"


def machine_key() -> int:
    """The machine and network namespace this process runs in, as a signed 64-bit integer (to compare in one
    integer collective): processes with the same key share the machine's cores and can reach each other's
    sockets in Linux's abstract namespace, which is per network namespace (the "hosts" of
    ``tests/test_multihost.py`` share a kernel but not that)."""
    try:
        network = os.readlink("/proc/self/ns/net")
    except OSError:  # no /proc (not Linux): this process alone
        network = f"unknown-{os.getpid()}"
    digest = hashlib.blake2b(f"{boot_id()} {network}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)
