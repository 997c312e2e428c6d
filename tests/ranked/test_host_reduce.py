"""A crowded machine's all-reduce (gflowdist.comm.host_reduce) between real ranks: MPI's results, every rank alike.

Bound to the ``comm`` fixture (world of one, MPI or gloo). Each test sets this process's waits to a crowded
machine's on every rank, as a ``gflowdist run`` job on a machine with fewer cores than ranks does. An MPI or
gloo group of two ranks or more then reduces through shared memory; in a world of one the results must be
the same all the same.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.host_reduce import HOST_MAX_BYTES, HostReduce, fits_queue
from gflowdist.comm.polling import set_crowded


@pytest.fixture
def group(comm):
    """A communicator over the same ranks whose first all-reduce decides afresh (MPI: a duplicate; gloo: a
    group split from the world; a world of one in this process: the world itself), freed after the test."""
    if comm.engine == "mpi":
        from gflowdist.comm.mpi import MPIComm

        made = MPIComm(comm.mpi_comm.Dup())
    elif comm.engine == "torch":
        made = comm.split([list(range(comm.size))])
    else:
        yield comm  # nobody to reduce with
        return
    try:
        yield made
    finally:
        made.free()


def uses_shared_memory(comm) -> bool:
    """Whether a crowded group of this engine and size reduces through shared memory."""
    return comm.engine in ("mpi", "torch") and comm.size > 1 and fits_queue(comm.size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_crowded_ranks_get_the_exact_reductions_and_their_groups_go_through_shared_memory(
    comm, group, restore_waits, dtype
):
    set_crowded(True)
    ranks = torch.arange(1, comm.size + 1, dtype=dtype)
    for call, n in enumerate([3, 3, 40, 5000, 7]):  # both halves of the mapping, and a grown one
        base = torch.arange(n, dtype=dtype) + call
        summed = group.all_reduce(base * (comm.rank + 1))
        assert torch.equal(summed, base * ranks.sum())
        assert torch.equal(group.all_reduce(base + comm.rank, ReduceOp.MAX), base + comm.size - 1)
        assert torch.equal(group.all_reduce(base - comm.rank, ReduceOp.MIN), base - (comm.size - 1))
        if dtype.is_floating_point:
            averaged = group.all_reduce(torch.full((n,), float(comm.rank), dtype=dtype), ReduceOp.AVG)
            assert torch.allclose(averaged, torch.full((n,), (comm.size - 1) / 2, dtype=dtype))
    shared = uses_shared_memory(comm)
    assert isinstance(group._host, HostReduce) is shared
    assert not shared or group._host.capacity >= 5000 * ranks.element_size()


def test_where_one_member_has_a_core_of_its_own_the_group_keeps_its_engines_all_reduce(comm, group, restore_waits):
    set_crowded(comm.rank != 0)  # every member must be crowded for the group to use shared memory
    summed = group.all_reduce(torch.ones(4) * comm.rank)
    assert torch.equal(summed, torch.full((4,), float(sum(range(comm.size)))))
    if comm.engine in ("mpi", "torch"):
        assert group._host is False


def test_every_rank_holds_the_same_bits_after_a_float_sum(comm, group, restore_waits):
    set_crowded(True)
    mine = torch.from_numpy(np.random.default_rng(comm.rank).standard_normal(1000).astype(np.float32))
    summed = group.all_reduce(mine)
    every = comm.all_gather(summed)
    assert all(torch.equal(other, summed) for other in every)


def test_arrays_over_the_cap_keep_the_engines_all_reduce_and_the_mapping_is_not_grown_for_them(
    comm, group, restore_waits
):
    set_crowded(True)
    assert torch.equal(group.all_reduce(torch.ones(8)), torch.full((8,), float(comm.size)))
    calls = group._host.calls if uses_shared_memory(comm) else None
    big = torch.full((HOST_MAX_BYTES // 4 + 1,), float(comm.rank))
    assert torch.equal(group.all_reduce(big), torch.full_like(big, float(sum(range(comm.size)))))
    if calls is not None:
        assert group._host.calls == calls and group._host.capacity < big.nbytes
