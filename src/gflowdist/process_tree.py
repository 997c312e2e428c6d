"""Finding and ending every process a launcher started, whatever session it moved to.

MPICH's hydra starts each proxy and each rank in a session of its own, so
killing the launcher's process group does not reach the ranks. The launcher
therefore becomes a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``):
descendants whose parent dies are re-parented to it instead of to init, and
:class:`DescendantTracker` finds them all by walking ``/proc``. Pure standard library:
the CLI imports this without loading torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["DescendantTracker", "become_subreaper", "descendants", "die_with_parent", "is_running", "kill_group"]

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PDEATHSIG = 1


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); False where the OS has no such feature."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux ``PR_SET_PDEATHSIG``);
    a ``preexec_fn`` for a child that must not outlive the process that started it. Elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:  # the process ended while we looked
        return None
    # the command name (2nd field) may contain spaces: parse after its closing parenthesis
    return stat[stat.rfind(")") + 2 :].split()


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.listdir("/proc"):
        fields = _stat_fields(entry) if entry.isdigit() else None
        if fields is not None:
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first)."""
    if not os.path.isdir("/proc"):
        return []
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to process group ``pgid`` (a child started with ``start_new_session=True``: its
    pid); a group already gone, or not ours to signal, is left alone.

    Hydra moves each rank into a session of its own, out of reach of this: end
    a job's ranks with :class:`DescendantTracker` (or, in tests, a marker).
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


class DescendantTracker:
    """Every descendant of ``pid`` ever seen, so a process is not lost while it is re-parented.

    One scan of ``/proc`` is not atomic: when a rank's parent (hydra's proxy)
    exits during the scan, the rank may show a parent that is already gone,
    and :func:`descendants` misses it although it is alive (and about to be
    re-parented to the subreaper). Scanning now and then and remembering what
    was seen closes that gap: :meth:`running` is every remembered process
    still alive.
    """

    def __init__(self, pid: int, exempt: tuple[int, ...] = ()):
        self.pid = pid
        self.seen: set[int] = set()
        #: descendants that are not the job's (the warm parent: it ends by itself; the ranks it forks count)
        self.exempt = set(exempt)

    def scan(self) -> None:
        self.seen.update(descendants(self.pid))
        self.seen -= self.exempt

    def running(self) -> list[int]:
        self.scan()
        alive = sorted(p for p in self.seen if is_running(p))
        self.seen = set(alive)
        return alive

    def kill(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every running descendant, remembered or new; returns the pids."""
        targets = self.running()
        for target in targets:
            try:
                os.kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return targets
