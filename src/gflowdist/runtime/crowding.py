"""Whether the job's ranks outnumber the cores of their machine, and the waits that follow from it.

A rank waiting for a peer spins briefly before it sleeps, so that a reply on
its way is seen within microseconds (:mod:`gflowdist.comm.polling`). That is
right while every rank has a core of its own. Where the ranks of one machine
outnumber its cores (3 trainers + 1 buffer on 2 cores), the peer a trainer
waits for is often the very process its spin keeps off a core: the spin
yields, but a yielding process still counts as runnable for the kernel's
load balancer. There the waits for peers (collectives, receives, the replay
buffer's idle loop) spin for a shorter time and sleep in shorter steps
(:func:`gflowdist.comm.polling.peer_wait`).

:func:`decide_crowding` is collective over the world, once per rank at
start-up: every rank tells the others the machine it runs on (the kernel's
boot id, which network-namespace "hosts" of one machine share, since they
share its cores) and the CPUs it may run on. A machine's cores are the union
of its ranks' CPUs, so ranks bound to a core each are not crowded and ranks
that share one core are.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gflowdist.comm import Communicator
from gflowdist.comm.machine import boot_id
from gflowdist.comm.polling import SPIN_S, set_crowded

__all__ = ["Crowding", "decide_crowding", "crowding_of", "my_cpus"]


@dataclass(frozen=True)
class Crowding:
    """The job's ranks on this rank's machine, and the cores they may run on."""

    ranks: int
    cores: int

    @property
    def crowded(self) -> bool:
        return self.ranks > self.cores

    def describe(self) -> str:
        how = "short spins" if self.crowded else f"spin {SPIN_S * 1e3:g} ms"
        cores = "1 core" if self.cores == 1 else f"{self.cores} cores"
        return f"{self.ranks} ranks of this job on {cores} here: waits for peers use {how}"


def my_cpus() -> set[int]:
    """The CPUs this process may run on (every CPU where the platform cannot say)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def crowding_of(entries: list[tuple[str, set[int]]], me: int) -> Crowding:
    """From every rank's ``(machine, cpus)``: rank ``me``'s machine's ranks and the union of their CPUs."""
    machine = entries[me][0]
    here = [cpus for m, cpus in entries if m == machine]
    return Crowding(ranks=len(here), cores=len(set().union(*here)))


def decide_crowding(world: Communicator) -> Crowding:
    """Collective: every rank's machine and CPUs; sets this process's waits (see the module's docstring)."""
    mine = f"{boot_id()} {','.join(map(str, sorted(my_cpus())))}"
    entries = []
    for raw in world.all_gather_bytes(mine.encode()):
        machine, _, cpus = raw.decode().partition(" ")
        entries.append((machine, {int(c) for c in cpus.split(",") if c}))
    crowding = crowding_of(entries, world.rank)
    set_crowded(crowding.crowded)
    return crowding
