"""Ranks as threads: N communicators of one process over in-memory queues (the ``local`` engine).

:class:`ThreadWorld` holds what the ranks of one job share (their inboxes,
the meeting points of their collectives, the abort status);
:meth:`ThreadWorld.comms` gives each rank its :class:`ThreadComm`. Every
message is a copy, as on the wire: a sender may reuse its buffer at once and a
receiver owns what it gets. Collectives meet under one lock per group and
reduce in rank order, so a sum is the same on every rank and in every run.

It serves two purposes (docs/troubleshooting.md, "One process, every rank"):
``gflowdist run CONFIG --engine local -n 4`` runs a whole layout in one
process, where a breakpoint in a role works in any debugger and a failure
shows one traceback; and the role loops are tested in milliseconds without
mpiexec. What only real processes show (MPI itself, kill -9, hosts) stays
tested with real processes.

:meth:`ThreadComm.abort` ends the whole job: every rank's next communicator
call raises :class:`JobAborted` (a ``SystemExit`` with the code), and waits
return within their poll interval.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gflowdist.comm.base import (
    ArrayLike,
    AsyncSendHandle,
    Communicator,
    CompletedSend,
    Inbox,
    ReduceOp,
    check_groups,
    file_in_inbox,
    require_float_for_avg,
    take_from_inbox,
)
from gflowdist.comm.buffers import as_byte_array
from gflowdist.engines import LOCAL
from gflowdist.errors import DeadlineError

__all__ = ["ThreadWorld", "ThreadComm", "JobAborted"]

#: How often a waiting collective wakes up to look at the abort status, its deadline and its wait hook.
POLL_S = 0.02


class JobAborted(SystemExit):
    """Another rank of this thread world ended the job (:meth:`ThreadComm.abort`); ``code`` is its status."""


class _Round:
    """One collective call of a group: each member's contribution, and how many have taken the result."""

    __slots__ = ("arrived", "made", "taken", "values")

    def __init__(self, size: int) -> None:
        self.values: list[Any] = [None] * size
        self.arrived = 0
        self.taken = 0
        self.made: Any = None  # what the first member of a split made for all (the new groups)


class _Group:
    """What the members of one communicator share: inboxes and the rounds of their collectives."""

    def __init__(self, world: ThreadWorld, members: Sequence[int]) -> None:
        self.world = world
        self.members = list(members)  # world ranks, in this group's rank order
        self.size = len(self.members)
        self.cond = threading.Condition(world.lock)
        self.inboxes: list[Inbox] = [{} for _ in self.members]
        self.rounds: dict[int, _Round] = {}


class ThreadWorld:
    """The shared state of one job whose ``size`` ranks are threads of this process."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a thread world needs at least one rank, got {size}")
        self.size = size
        self.lock = threading.RLock()
        self.aborted: int | None = None  # the exit status of the rank that ended the job
        self.aborted_by: int | None = None
        self.failed_first: int | None = None  # the rank whose failure is reported (claim_failure)
        #: stop flags of the ranks (gflowdist.runtime.process registers them): the launcher's signal handler
        #: sets them all, since only the main thread may catch a signal
        self.stop_flags: list[Any] = []
        #: the job's run directory, once its ranks agreed on it (gflowdist.runtime.process)
        self.run_dir: Path | None = None
        self._world = _Group(self, range(size))

    def comms(self) -> list[ThreadComm]:
        """One world communicator per rank, rank ``i`` at index ``i``."""
        return [ThreadComm(self._world, rank) for rank in range(self.size)]

    def stop_all(self, reason: str) -> None:
        """Set every rank's stop flag (a signal to the launcher: the clean stop of every rank)."""
        for flag in list(self.stop_flags):
            flag.set(reason)

    def claim_failure(self, rank: int) -> bool:
        """True for the first rank that asks (it reports the job's failure), False for every later one."""
        with self.lock:
            if self.failed_first is None and self.aborted is None:
                self.failed_first = rank
                return True
            return False

    def abort(self, rank: int, code: int) -> None:
        with self.lock:
            if self.aborted is None:
                self.aborted, self.aborted_by = code, rank
            self._world.cond.notify_all()


class ThreadComm(Communicator):
    """One rank of a :class:`ThreadWorld` (or of a group split from it)."""

    engine = LOCAL.name
    ranks_are_threads = True

    def __init__(self, group: _Group, rank: int) -> None:
        self._group = group
        self.world = group.world
        self.rank = rank
        self.size = group.size
        self._seq = 0  # collectives this rank has entered on this communicator

    def world_rank(self, rank: int) -> int:
        return self._group.members[rank]

    def first_to_fail(self) -> bool:
        return self.world.claim_failure(self.world_rank(self.rank))

    # -- collectives ------------------------------------------------------------
    def _exchange(
        self, value: Any, what: str, timeout: float | None = None, make: Callable[[], Any] | None = None
    ) -> tuple[list[Any], Any]:
        """Every member's ``value`` in rank order (and what ``make`` built once for all), when all arrived."""
        self._check_aborted()
        group, seq = self._group, self._seq
        self._seq += 1
        deadline = None if timeout is None else time.monotonic() + timeout
        with group.cond:
            entry = group.rounds.get(seq)
            if entry is None:
                entry = group.rounds[seq] = _Round(group.size)
                if make is not None:
                    entry.made = make()
            entry.values[self.rank] = value
            entry.arrived += 1
            if entry.arrived == group.size:
                group.cond.notify_all()
            while entry.arrived < group.size:
                self._check_aborted()
                if deadline is not None and time.monotonic() > deadline:
                    missing = [r for r, v in enumerate(entry.values) if v is None]
                    raise DeadlineError(f"{what}: ranks {missing} did not arrive within {timeout:g} s")
                group.cond.wait(POLL_S)
                if self.wait_hook is not None and entry.arrived < group.size:
                    group.cond.release()  # the hook sends heartbeats: never under the group's lock
                    try:
                        self.wait_hook()
                    finally:
                        group.cond.acquire()
            entry.taken += 1
            if entry.taken == group.size:
                del group.rounds[seq]
            return entry.values, entry.made

    def barrier(self, timeout: float | None = None) -> None:
        self._exchange(True, "barrier", timeout)

    def all_reduce(self, x: ArrayLike, op: ReduceOp = ReduceOp.SUM, *, inplace: bool = True) -> ArrayLike:
        if op is ReduceOp.AVG:
            require_float_for_avg(x)
        values, _ = self._exchange(_copy(x), f"all_reduce ({op.value})")
        result: ArrayLike = _reduce(values, op)  # the same kind as x: every rank passed one
        if not inplace:
            return result
        if isinstance(x, torch.Tensor):
            x.copy_(result)
        else:
            np.copyto(x, result)
        return x

    def all_gather(self, x: ArrayLike) -> list[ArrayLike]:
        values, _ = self._exchange(_copy(x), "all_gather")
        return [_copy(v) for v in values]

    def broadcast(self, x: ArrayLike, src: int = 0) -> ArrayLike:
        self._check_peer(src, "src")
        values, _ = self._exchange(_copy(x) if self.rank == src else True, f"broadcast from rank {src}")
        if self.rank != src:
            if isinstance(x, torch.Tensor):
                x.copy_(values[src])
            else:
                np.copyto(x, values[src])
        return x

    def gather(self, x: ArrayLike, dst: int = 0) -> list[ArrayLike] | None:
        self._check_peer(dst, "dst")
        values, _ = self._exchange(_copy(x), f"gather to rank {dst}")
        return [_copy(v) for v in values] if self.rank == dst else None

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        values, _ = self._exchange(bytes(data), "all_gather_bytes")
        return list(values)

    def split(self, groups: Sequence[Sequence[int]]) -> ThreadComm | None:
        checked = check_groups(groups, self.size)
        members = self._group.members

        def make() -> list[_Group]:
            return [_Group(self.world, [members[r] for r in group]) for group in checked]

        _, made = self._exchange(True, "split", make=make)
        for group, new in zip(checked, made, strict=True):
            if self.rank in group:
                return ThreadComm(new, group.index(self.rank))
        return None

    # -- point to point ---------------------------------------------------------
    def isend(self, data: Any, dst: int, tag: int = 0, *, kind: int = 0) -> AsyncSendHandle:
        self._check_send(dst, tag, kind)
        self._check_aborted()
        payload = torch.from_numpy(as_byte_array(data).copy())
        with self._group.cond:
            file_in_inbox(self._group.inboxes[dst], tag, (self.rank, payload, kind))
        return CompletedSend(dst, tag, payload.numel())

    def try_recv_kind(self, src: int | None = None, tag: int = 0) -> tuple[int, torch.Tensor, int] | None:
        self._check_peer(src, "src", allow_none=True)
        self._check_aborted()
        with self._group.cond:
            return take_from_inbox(self._group.inboxes[self.rank], src, tag)

    # -- lifetime ---------------------------------------------------------------
    def abort(self, code: int = 1) -> None:
        self.world.abort(self.world_rank(self.rank), code)
        raise JobAborted(code)

    def _check_aborted(self) -> None:
        code = self.world.aborted
        if code is not None:
            raise JobAborted(code)


def _copy(x: ArrayLike) -> ArrayLike:
    return x.detach().clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)


def _reduce(values: list[Any], op: ReduceOp) -> Any:
    """``values`` reduced in rank order (the same bits on every rank)."""
    result = _copy(values[0])
    for value in values[1:]:
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            result += value
        elif op is ReduceOp.MAX:
            result = torch.maximum(result, value) if isinstance(result, torch.Tensor) else np.maximum(result, value)
        elif op is ReduceOp.MIN:
            result = torch.minimum(result, value) if isinstance(result, torch.Tensor) else np.minimum(result, value)
        else:
            raise ValueError(f"unknown reduction {op!r}")
    if op is ReduceOp.AVG:
        result /= len(values)
    return result
