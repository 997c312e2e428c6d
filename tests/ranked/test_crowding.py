"""Every rank's view of its machine: the job's ranks on it and the cores they share (gflowdist.runtime.crowding).

Bound to the ``comm`` fixture (world of one, MPI or gloo). The ranks of these
runs are all on this machine and none is bound to a core.
"""

from __future__ import annotations

from gflowdist.comm.polling import SPIN_S, is_crowded, peer_wait
from gflowdist.runtime.crowding import decide_crowding, my_cpus


def test_every_rank_counts_the_whole_job_on_this_machine_and_waits_accordingly(comm, restore_waits):
    crowding = decide_crowding(comm)
    assert (crowding.ranks, crowding.cores) == (comm.size, len(my_cpus()))
    assert is_crowded() is (comm.size > len(my_cpus()))
    assert (peer_wait().spin_s < SPIN_S) is is_crowded()
