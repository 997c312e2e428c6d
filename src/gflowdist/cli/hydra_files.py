"""The file hydra's proxy leaves in ``/tmp`` when it is killed: its hwloc topology, removed by the launcher.

MPICH's hydra proxy writes the machine's hwloc topology to
``/tmp/hydra_hwloc_xmlfile_XXXXXX`` (``mkstemp``: the path is fixed, ``TMPDIR``
does not move it) the first time one of its ranks asks for it in
``MPI_Init``, keeps that file open, and unlinks it when it exits normally. A
proxy that is killed leaves it behind: the launcher ends a failed job's
leftover processes with SIGKILL, so every job that lost a rank left one
(about 70 from one run of the test suite, 5-50 KB each).

:class:`TopologyFiles` notes, while the job runs, the file each of the job's
proxies holds open (a proxy is a process whose ``/proc/PID/comm`` is
``hydra_pmi_proxy``), and removes those that are still there once every
process of the job is gone. Only files that a proxy of this job held open
are touched: another job's file is never removed. A proxy on another host
is not this machine's process; its file stays there (hydra's own behaviour).
Pure standard library: the CLI imports this without loading torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["PROXY_NAME", "TOPOLOGY_PREFIX", "TopologyFiles", "process_name", "topology_file"]

#: ``/proc/PID/comm`` of hydra's proxy (the kernel keeps 15 characters: all of this name)
PROXY_NAME = "hydra_pmi_proxy"
#: the path hydra's proxy gives its topology file, before mkstemp's six characters
TOPOLOGY_PREFIX = "/tmp/hydra_hwloc_xmlfile_"


class TopologyFiles:
    """The topology files this job's local hydra proxies held open (module docstring)."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self._found: set[int] = set()  # proxies whose file is noted: not looked at again

    def note(self, pids: Iterable[int]) -> None:
        """Note the topology file each hydra proxy among ``pids`` holds open (a proxy makes it lazily, at its
        first rank's ``MPI_Init``: one without it yet is looked at again next time)."""
        for pid in pids:
            if pid in self._found or process_name(pid) != PROXY_NAME:
                continue
            path = topology_file(pid)
            if path is not None:
                self.files.add(path)
                self._found.add(pid)

    def remove(self) -> tuple[list[str], list[str]]:
        """Remove the noted files still there (call once the job's processes are gone): ``(removed, failures)``,
        each failure a line naming the file and the error. A file already gone was removed by its proxy."""
        removed, failures = [], []
        for path in sorted(self.files):
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError as err:
                failures.append(f"could not remove hydra's topology file {path}: {err.strerror} [{err.errno}]")
        self.files.clear()
        return removed, failures


def process_name(pid: int) -> str | None:
    """``/proc/PID/comm`` (None once the process is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:  # gone, or not ours to read
        return None


def topology_file(pid: int) -> str | None:
    """The ``/tmp/hydra_hwloc_xmlfile_*`` file process ``pid`` holds open, if any."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed while we looked
            continue
        if target.startswith(TOPOLOGY_PREFIX):
            return target
    return None
