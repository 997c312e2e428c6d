"""Native groups: torchgfn's contexts hold them, every compat function takes them, users' own included.

torchgfn 2.4.1's scripts use the context's groups with torch.distributed and
mpi4py directly (``dist.barrier(group=...)``, ``dist.broadcast(..., src=0,
group=pg)``, ``dist.all_reduce(p.grad, group=pg)``; ``comm.Barrier()``,
``.Get_size()``, ``.Allreduce(MPI.IN_PLACE, ...)``, ``.allgather(...)``); the
first test does exactly that. The others pass groups the user built
(``MPI.COMM_WORLD.Split`` / ``Create``, ``dist.new_group``) to the functions
of all five compat modules. Under mpiexec the torch context sets up gloo
itself next to MPI, as torchgfn's tutorials run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import gflowdist
import gflowdist.compat.torchgfn as tg
from gflowdist.comm.native import NotAMemberError, as_communicator
from gflowdist.compat import evorl, omnisafe, spinup, virtex


def test_top_level_get_world_size_is_the_job_size(comm):
    assert gflowdist.get_world_size() == comm.size and gflowdist.get_rank() == comm.rank


def broadcast_name_like_the_scripts(pg, is_root: bool) -> str:
    """train_hypergrid.py's wandb group name: a length, then the bytes, from rank 0 over ``pg``."""
    name = b"run-1234_3" if is_root else None
    length = torch.tensor([len(name)], dtype=torch.long) if is_root else torch.zeros(1, dtype=torch.long)
    dist.broadcast(length, src=0, group=pg)
    payload = torch.tensor(list(name), dtype=torch.uint8) if is_root else torch.empty(int(length), dtype=torch.uint8)
    dist.broadcast(payload, src=0, group=pg)
    return bytes(payload.tolist()).decode()


def test_context_groups_work_with_torch_and_mpi4py_calls(comm):
    if comm.size == 1:
        ctx = tg.initialize_distributed_compute("gloo", 1)
        assert ctx.train_global_group is None and ctx.agent_groups == [None]  # single-process mode
        assert tg.get_world_size(group=ctx.train_global_group) == 1  # None: the world (of one)
        return
    owned = not dist.is_initialized()  # under mpiexec the context sets up gloo itself
    ctx = tg.initialize_distributed_compute("gloo", 1, num_agent_groups=1)
    trainers = ctx.training_ranks
    if ctx.is_training_rank():
        pg = ctx.train_global_group
        assert isinstance(pg, dist.ProcessGroup) and dist.get_world_size(pg) == len(trainers)
        dist.barrier(group=pg)
        assert broadcast_name_like_the_scripts(pg, ctx.my_rank == 0) == "run-1234_3"
        grad = torch.full((3,), float(ctx.my_rank))  # train_hypergrid_ddp.py's gradient all-reduce
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=pg)
        assert grad.tolist() == [float(sum(trainers))] * 3
        dist.barrier(group=ctx.agent_groups[ctx.agent_group_id])
        # the same group given to gflowdist: the context's own communicator, not a second one
        assert as_communicator(pg) is ctx.core.comm("trainers")
        assert tg.get_world_size("torch", pg) == len(trainers) and tg.get_rank("torch", pg) == trainers.index(comm.rank)
    else:
        assert ctx.train_global_group == dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_world_size(ctx.buffer_group) == 1
    if owned:  # started by mpiexec: dc_mpi4py holds mpi4py communicators of the same layout
        from mpi4py import MPI

        t_comm = ctx.dc_mpi4py.train_global_group
        if ctx.is_training_rank():
            t_comm.Barrier()
            assert t_comm.Get_size() == len(trainers)
            total = np.array([float(comm.rank)])
            t_comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
            assert total[0] == sum(trainers)
            assert t_comm.allgather(comm.rank) == trainers
            assert tg.get_world_size("mpi", t_comm) == len(trainers)
        else:
            assert t_comm == MPI.COMM_NULL and tg.get_rank("mpi", t_comm) == -1
    ctx.cleanup()
    comm.barrier()


def user_group(comm):
    """The issue's group: every rank but 0 (``Split(UNDEFINED)`` / ``new_group``); ``(group, members)``."""
    members = list(range(1, comm.size))
    if comm.engine == "torch":
        return dist.new_group(members), members
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return world.Split(0 if world.Get_rank() else MPI.UNDEFINED, world.Get_rank()), members


def check_every_module(group, members, rank: int) -> None:
    """The functions of all five compat modules over ``group``: closed forms in the members' world ranks."""
    n, me = len(members), members.index(rank)
    mean = sum(members) / n
    assert spinup.num_procs(group) == virtex.get_world_size(group) == omnisafe.world_size(group) == n
    assert spinup.proc_id(group) == virtex.get_rank(group) == evorl.get_process_id(group) == me
    assert tg.get_world_size("mpi", group) == n and evorl.is_dist_initialized(group) == (n > 1)
    assert spinup.mpi_avg(float(rank), group) == pytest.approx(mean)
    assert float(omnisafe.dist_avg(float(rank), group)) == pytest.approx(mean)
    assert float(evorl.psum(torch.tensor(float(rank)), group)) == sum(members)
    x = {"a": torch.full((2,), float(rank))}
    virtex.average_across_processes(x, group)
    assert x["a"].tolist() == pytest.approx([mean] * 2)
    total = torch.tensor([float(rank)])
    tg.all_reduce(total, backend="torch", group=group)  # the group decides the engine, whatever backend says
    assert float(total) == sum(members)
    value = torch.tensor([float(rank)])
    tg.broadcast(value, src=n - 1, group=group)  # src is a rank of the group on both backends
    assert float(value) == members[-1]
    out = [torch.zeros(1) for _ in members]
    tg.all_gather(out, torch.tensor([float(rank)]), group=group)
    assert [float(o) for o in out] == members
    gathered = tg.gather_distributed_data(torch.full((1, 2), float(rank)), training_group=group)
    assert (gathered.tolist() == [[float(r)] * 2 for r in members]) if me == 0 else gathered is None
    model = torch.nn.Linear(2, 1)
    torch.nn.init.constant_(model.weight, float(rank))
    tg.average_models(model, training_group=group)
    omnisafe.avg_params(model, group)
    assert model.weight.detach().tolist() == [[pytest.approx(mean)] * 2]
    model.weight.grad = torch.full_like(model.weight, float(rank))
    held = model.weight.grad
    spinup.mpi_avg_grads(model, group)
    assert model.weight.grad is held and held.tolist() == [[pytest.approx(mean)] * 2]
    tg.barrier(group=group)
    virtex.synchronize(group)


def ring_in_group_ranks(sub, members) -> None:
    """Point to point over the wrapper of a user's group: ranks are the group's, not the world's.

    A gloo wrapper once sent over the world's group with group ranks: group
    rank 0 (world rank 1) then posted its receives on itself, and freeing it
    failed with "Pair is not connected".
    """
    n, me = len(members), sub.rank
    if n < 2:
        return
    sub.send(f"from world rank {members[me]}".encode(), (me + 1) % n, tag=5)
    source, got = sub.recv((me - 1) % n, tag=5, timeout=30)
    assert source == (me - 1) % n
    assert got.numpy().tobytes() == f"from world rank {members[(me - 1) % n]}".encode()


def test_user_built_groups_in_every_compat_module(comm):
    if comm.engine == "local":
        pytest.skip("a world of one has no torch process group or MPI communicator to build from")
    group, members = user_group(comm)
    if comm.rank in members:
        check_every_module(group, members, comm.rank)
        assert as_communicator(group) is as_communicator(group), "one wrapper per group, cached"
        ring_in_group_ranks(as_communicator(group), members)
    else:  # what torch / MPI give a non-member: sizes of -1, collectives refused
        assert tg.get_world_size("mpi", group) == -1 == virtex.get_world_size(group)
        with pytest.raises(NotAMemberError, match="all_reduce: this rank is not a member"):
            tg.all_reduce(torch.ones(1), group=group)
    comm.barrier()


def test_mpi_create_and_split_groups(comm):
    """torchgfn's own MPI groups come from ``COMM_WORLD.Create(group.Incl(...))``: accepted as well."""
    if comm.engine != "mpi":
        pytest.skip("mpi4py communicators exist in MPI jobs")
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    evens = list(range(0, comm.size, 2))
    created = world.Create(world.Get_group().Incl(evens))
    halves = world.Split(comm.rank % 2, comm.rank)
    if comm.rank in evens:
        assert spinup.mpi_sum(1, created) == len(evens)
        created.Free()
    else:
        assert created == MPI.COMM_NULL and omnisafe.get_rank(created) == -1
    peers = [r for r in range(comm.size) if r % 2 == comm.rank % 2]
    assert float(evorl.pmean(torch.tensor(float(comm.rank)), halves)) == pytest.approx(sum(peers) / len(peers))
    comm.barrier()
