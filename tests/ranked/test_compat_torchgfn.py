"""gflowdist.compat.torchgfn under real ranks: torchgfn's rank rule, averaging, messages, fixed bugs.

MPI runs build contexts with ``initialize_distributed_compute_mpi4py`` (no
torch.distributed); gloo runs with ``initialize_distributed_compute("gloo")``
over the process group the fixture set up. Every rank checks the same
cross-rank facts (gathered with ``all_gather_bytes``).
"""

from __future__ import annotations

import json
import pickle

import pytest
import torch
import torch.distributed as dist

import gflowdist.compat.torchgfn as tg
from gflowdist.compat.torchgfn_groups import world_for
from gflowdist.errors import GflowdistError, LayoutError, ProtocolError
from gflowdist.transport import EncodeError


def backend_of(comm) -> str:
    return "torch" if comm.engine == "torch" else "mpi"


def make_context(comm, buffers, groups=1, coordinators=0):
    if comm.engine == "torch":
        return tg.initialize_distributed_compute("gloo", buffers, groups, use_coordinator=bool(coordinators))
    return tg.initialize_distributed_compute_mpi4py(buffers, groups, coordinators)


def gather_json(comm, value):
    return [json.loads(b) for b in comm.all_gather_bytes(json.dumps(value).encode())]


def torchgfn_rule(world, buffers, groups, coordinators):
    """Every rank's torchgfn fields, from the rule in docs/migration-torchgfn.md.

    The coordinator is W-1; the T = W-B-C trainers are cut into B consecutive
    chunks (the first T mod B one larger), each followed by its buffer; agent
    groups are G consecutive slices of the trainer list.
    """
    count = world - buffers - coordinators
    chunks, start = [], 0
    for index in range(max(buffers, 1)):
        size = count if buffers == 0 else count // buffers + (index < count % buffers)
        chunks.append((list(range(start, start + size)), None if buffers == 0 else start + size))
        start += size + (buffers > 0)
    trainers = [r for members, _ in chunks for r in members]
    per_group = count // groups
    group_of = {r: trainers.index(r) // per_group for r in trainers}
    facts = []
    for rank in range(world):
        facts.append(
            {
                "my_rank": rank,
                "world_size": world,
                "num_training_ranks": count,
                "agent_group_size": per_group,
                "agent_group_id": 0,
                "assigned_buffer": None,
                "assigned_training_ranks": None,
                "buffer_rank_set": sorted(b for _, b in chunks if b is not None),
                "coordinator_rank": world - 1 if coordinators else None,
                "roles": [rank in trainers, False, coordinators == 1 and rank == world - 1],
            }
        )
    for members, buffer in chunks:
        for r in members:
            facts[r].update(agent_group_id=group_of[r], assigned_buffer=buffer)
        if buffer is not None:
            facts[buffer].update(
                agent_group_id=group_of[members[0]], assigned_training_ranks=members, roles=[False, True, False]
            )
    return facts


def shapes(world):
    """(buffers, agent groups, coordinators) shapes valid at this world size (a few per size)."""
    if world == 1:
        return [(0, 1, 0)]
    found = []
    for buffers in range(world):
        for coordinators in (0, 1):
            count = world - buffers - coordinators
            if count >= max(buffers, 1):
                found.append((buffers, 2 if count % 2 == 0 else 1, coordinators))
    return found


def facts_of(ctx):
    return {
        "my_rank": ctx.my_rank,
        "world_size": ctx.world_size,
        "num_training_ranks": ctx.num_training_ranks,
        "agent_group_size": ctx.agent_group_size,
        "agent_group_id": ctx.agent_group_id,
        "assigned_buffer": ctx.assigned_buffer,
        "assigned_training_ranks": ctx.assigned_training_ranks,
        "buffer_rank_set": sorted(ctx.buffer_rank_set),
        "coordinator_rank": ctx.coordinator_rank,
        "roles": [ctx.is_training_rank(), ctx.is_buffer_rank(), ctx.is_coordinator_rank()],
    }


def test_rank_assignment_follows_torchgfn_rule(comm):
    for buffers, groups, coordinators in shapes(comm.size):
        ctx = make_context(comm, buffers, groups, coordinators)
        expected = torchgfn_rule(comm.size, buffers, groups, coordinators)
        assert gather_json(comm, facts_of(ctx)) == expected, (buffers, groups, coordinators)
        # the groups hold the ranks the rule says: sum of world ranks over each
        mine = expected[comm.rank]
        trainers = [f["my_rank"] for f in expected if f["roles"][0]]
        if ctx.is_training_rank():
            total = torch.tensor([float(comm.rank)])
            tg.all_reduce(total, backend=backend_of(comm), group=ctx.train_global_group)
            assert float(total) == sum(trainers)
            members = [r for r in trainers if expected[r]["agent_group_id"] == mine["agent_group_id"]]
            assert tg.get_world_size(group=ctx.agent_groups[ctx.agent_group_id]) == len(members)
        else:
            assert tg.get_rank(group=ctx.train_global_group) == -1
        if ctx.is_buffer_rank():
            assert tg.get_world_size(group=ctx.buffer_group) == buffers
        ctx.cleanup()


@pytest.mark.parametrize("which", ["agent group", "trainers"])
def test_model_averaging_divides_by_the_group_size(comm, which):
    # Fixed bug: torchgfn divides a sub-group's sum by the world size.
    if which == "agent group":
        ctx = make_context(comm, 0, 2 if comm.size % 2 == 0 else 1)
        group = ctx.agent_groups[ctx.agent_group_id]
    else:
        ctx = make_context(comm, 1 if comm.size > 1 else 0)
        group = ctx.train_global_group
    expected = torchgfn_rule(comm.size, len(ctx.buffer_rank_set), len(ctx.agent_groups), 0)
    if ctx.is_training_rank():
        members = [
            f["my_rank"]
            for f in expected
            if f["roles"][0] and (which == "trainers" or f["agent_group_id"] == ctx.agent_group_id)
        ]
        model = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(model.weight, float(comm.rank))
        torch.nn.init.constant_(model.bias, 7.0)
        tg.average_models(model, training_group=group)
        assert model.weight.detach().tolist() == [[sum(members) / len(members)] * 2]
        tg.average_models(model, training_group=group)  # identical weights stay identical
        assert model.bias.item() == 7.0 and model.weight[0, 0].item() == sum(members) / len(members)
        model.zero_grad()
        (model.weight.sum() * (comm.rank + 1)).backward()  # grad of weight = rank + 1, bias: None
        tg.average_gradients(model, group)
        assert model.weight.grad.tolist() == [[sum(r + 1 for r in members) / len(members)] * 2]
        assert model.bias.grad is None
    ctx.cleanup()


def test_send_isend_recv_ring(comm):
    backend = backend_of(comm)
    peer, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    raw = torch.frombuffer(bytearray(f"bytes from {comm.rank}".encode()), dtype=torch.uint8)
    handles = [
        tg.isend(raw, peer, backend=backend, tag=0),
        tg.isend(torch.arange(5, dtype=torch.float64) * comm.rank, peer, backend=backend, tag=1),
    ]
    source, metadata = tg.recv(prev, backend=backend, tag=1, timeout=30)  # the later channel first
    assert source == prev and torch.equal(metadata, torch.arange(5, dtype=torch.float64) * prev)
    tg.send(
        {"message_type": "DATA", "message_data": {"rank": comm.rank, "x": torch.full((2, 2), comm.rank)}},
        peer,
        backend=backend,
        tag=0,
    )
    source, first = tg.recv(backend=backend, tag=0, timeout=30)
    assert source == prev and bytes(first.numpy()) == f"bytes from {prev}".encode()
    source, second = tg.recv(prev, backend=backend, tag=0, timeout=30)
    assert second["message_data"]["rank"] == prev and torch.equal(second["message_data"]["x"], torch.full((2, 2), prev))
    for handle in handles:
        handle.wait(timeout=30)
        assert handle.is_complete()
    comm.barrier()


def test_buffer_manager_round_trip(comm):
    """torchgfn's ReplayBufferManager pattern: DATA to the buffer, a score back, metadata on tag 1."""
    if comm.size == 1:
        pytest.skip("needs a buffer rank")
    backend = backend_of(comm)
    ctx = make_context(comm, 1)
    if ctx.is_buffer_rank():
        pending = []
        for _ in ctx.assigned_training_ranks:
            sender, message = tg.recv(backend=backend, timeout=30)
            assert message["message_type"] == "DATA"
            score = float(message["message_data"]["log_rewards"].sum())
            pending.append(tg.isend({"score": score, "sender": sender}, sender, backend=backend))
        for sender in ctx.assigned_training_ranks:
            tg.send({"n_modes_found": len(ctx.assigned_training_ranks)}, sender, backend=backend, tag=1)
        while pending:
            pending = [h for h in pending if not h.is_complete()]
    else:
        log_rewards = torch.full((3,), float(comm.rank))
        tg.send(
            {"message_type": "DATA", "message_data": {"log_rewards": log_rewards}}, ctx.assigned_buffer, backend=backend
        )
        _, metadata = tg.recv(ctx.assigned_buffer, backend=backend, tag=1, timeout=30)
        _, reply = tg.recv(ctx.assigned_buffer, backend=backend, timeout=30)
        assert reply == {"score": 3.0 * comm.rank, "sender": comm.rank}
        assert metadata == {"n_modes_found": ctx.num_training_ranks}
    ctx.cleanup()
    comm.barrier()


def test_gather_distributed_data(comm):
    local = torch.full((comm.rank + 1, 2, 3), float(comm.rank))
    gathered = tg.gather_distributed_data(local, world_size=comm.size, rank=comm.rank)
    if comm.rank == 0:
        expected = torch.cat([torch.full((r + 1, 2, 3), float(r)) for r in range(comm.size)])
        assert torch.equal(gathered, expected)
    else:
        assert gathered is None
    ctx = make_context(comm, 1 if comm.size > 1 else 0)
    if ctx.is_training_rank():
        rows = torch.full((ctx.my_rank % 2, 4), ctx.my_rank)  # some trainers hold no rows
        gathered = tg.gather_distributed_data(rows, training_group=ctx.train_global_group)
        trainers = [r for r in range(comm.size) if r not in ctx.buffer_rank_set]
        if tg.get_rank(group=ctx.train_global_group) == 0:
            assert gathered.tolist() == [[r] * 4 for r in trainers if r % 2]
        else:
            assert gathered is None
    ctx.cleanup()


def test_broadcast_src_is_a_rank_of_the_group(comm):
    # Fixed bug: torchgfn's torch path read src as a global rank, its MPI path as a group rank.
    backend = backend_of(comm)
    everyone = torch.tensor([float(comm.rank)])
    tg.broadcast(everyone, src=comm.size - 1, backend=backend)
    assert float(everyone) == comm.size - 1
    if comm.size == 1:
        return
    tail = comm.split([list(range(1, comm.size))])  # group rank 0 is world rank 1
    if tail is not None:
        assert tg.get_rank(backend, tail) == comm.rank - 1
        value = torch.tensor([float(comm.rank)])
        tg.broadcast(value, src=0, backend=backend, group=tail)
        assert float(value) == 1.0
        tail.free()
    comm.barrier()


def test_initialize_mpi4py_needs_no_torch_distributed(comm):
    # Fixed bug: torchgfn's version calls torch.distributed.barrier() and fails on its own.
    if comm.engine == "torch":
        with pytest.raises(GflowdistError, match="no MPI launcher"):
            tg.initialize_distributed_compute_mpi4py(1)
        return
    assert not dist.is_initialized()
    ctx = tg.initialize_distributed_compute_mpi4py(1 if comm.size > 1 else 0)
    count = torch.ones(1)
    tg.all_reduce(count, backend="mpi")
    assert float(count) == comm.size and ctx.world_size == comm.size
    if comm.size > 1:
        other = tg.initialize_distributed_compute_mpi4py(0)
        with pytest.raises(LayoutError, match="differs"):
            tg.initialize_distributed_compute_mpi4py(1, layout=other.core.layout)
        other.cleanup()
    ctx.cleanup()


def test_cleanup_never_raises_and_is_idempotent(comm):
    # Fixed bug: torchgfn's cleanup Free()s groups this rank is not in and finalizes MPI.
    ctx = make_context(comm, 1 if comm.size > 1 else 0)
    ctx.cleanup()
    ctx.cleanup()
    tg.barrier(backend_of(comm))  # MPI and the process group still work


def test_non_members_hold_what_torchgfn_gives_and_cannot_use_the_group(comm):
    if comm.size == 1:
        pytest.skip("needs a buffer rank")
    ctx = make_context(comm, 1)
    if comm.engine == "torch":
        outside = dist.GroupMember.NON_GROUP_MEMBER
    else:
        from mpi4py import MPI

        outside = MPI.COMM_NULL
    if ctx.is_buffer_rank():
        assert ctx.train_global_group == outside and all(g == outside for g in ctx.agent_groups)
        assert tg.get_rank(group=ctx.train_global_group) == -1
        with pytest.raises(GflowdistError, match="barrier: this rank is not a member of the group"):
            tg.barrier(backend_of(comm), ctx.train_global_group)
    else:
        assert ctx.buffer_group == outside
        with pytest.raises(GflowdistError, match="all_reduce: this rank is not a member of the group"):
            tg.all_reduce(torch.ones(1), group=ctx.buffer_group)
    ctx.cleanup()


def test_wire_never_pickles(comm, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    for name in ("dumps", "loads", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    backend = backend_of(comm)
    world = world_for(comm.engine if comm.engine != "local" else "mpi")
    peer, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    with pytest.raises(EncodeError, match="never pickles"):
        tg.send({"modes": {1, 2}}, peer, backend=backend)  # refused before anything is sent
    sent = tg.isend({"modes": [1, 2], "states": torch.ones(2)}, peer, backend=backend, tag=3)
    source, wire = world.recv(prev, 3, timeout=30)  # what actually crossed: a gflowdist message
    sent.wait(timeout=30)
    assert source == prev and bytes(wire[:2].numpy()) == b"GF"
    handle = world.isend(b"\x80\x05not a message", peer, 3)  # e.g. an unmigrated torchgfn peer
    with pytest.raises(ProtocolError) as info:
        tg.recv(prev, backend=backend, tag=3, timeout=30)
    assert info.value.sender == prev
    handle.wait(timeout=30)
    comm.barrier()


def test_initialize_distributed_compute(comm):
    """The torch context: over MPI runs it sets up gloo itself and cleanup tears it down again."""
    if comm.size == 1:
        ctx = tg.initialize_distributed_compute("gloo", 0)
        assert ctx.world_size == 1 and ctx.get_train_group("mpi") is ctx.get_train_group("torch")
        ctx.cleanup()
        return
    owned = not dist.is_initialized()
    ctx = tg.initialize_distributed_compute("gloo", 1, use_coordinator=comm.size > 2)
    is_trainer = gather_json(comm, ctx.is_training_rank())
    assert dist.is_initialized() and ctx.training_ranks == [r for r, t in enumerate(is_trainer) if t]
    if ctx.is_training_rank():
        for backend in ("torch", "mpi") if owned else ("torch",):
            group = ctx.get_train_group(backend)  # torchgfn's handles: a ProcessGroup, an mpi4py Intracomm
            assert isinstance(group, dist.ProcessGroup) if backend == "torch" else type(group).__name__ == "Intracomm"
            total = torch.tensor([float(comm.rank)])
            tg.all_reduce(total, backend=backend, group=group)
            assert float(total) == sum(ctx.training_ranks)
    if owned:  # started under mpiexec: the MPI groups describe the same layout
        assert facts_of(ctx.dc_mpi4py) == facts_of(ctx)
    ctx.cleanup()
    ctx.cleanup()
    assert dist.is_initialized() is not owned  # destroyed only if this call created it
    comm.barrier()


def test_initialize_mpi4py_takes_rank_layouts_as_given(comm):
    """torchgfn's newest ``layout=``: a RankLayout (gflowdist's or torchgfn's own) is used as it is."""
    if comm.engine != "mpi" or comm.size < 2:
        pytest.skip("initialize_distributed_compute_mpi4py with a layout needs 2+ MPI ranks")
    from tests.support.originals import load_file, torchgfn_newest_distributed

    original = load_file(torchgfn_newest_distributed(), "torchgfn_distributed_newest").RankLayout
    planned = tg.initialize_distributed_compute_mpi4py(1)
    fields = ("assigned_buffer", "assigned_training_ranks", "agent_group_id", "buffer_rank_set", "num_training_ranks")
    for cls in (tg.RankLayout, original):
        ctx = tg.initialize_distributed_compute_mpi4py(1, layout=cls.build(comm.size, 1, 1, 1, 0))
        assert [getattr(ctx, f) for f in fields] == [getattr(planned, f) for f in fields]
        if ctx.is_training_rank():
            assert ctx.train_global_group.Get_size() == comm.size - 1
            ctx.train_global_group.Barrier()
        ctx.cleanup()
    planned.cleanup()
    # a layout no planner would make (the buffer first) is honoured, as torchgfn honours it
    others = list(range(1, comm.size))
    ctx = tg.initialize_distributed_compute_mpi4py(1, layout=tg.RankLayout(others, [0], [others], 1))
    assert ctx.is_buffer_rank() == (comm.rank == 0)
    assert ctx.assigned_training_ranks == (others if comm.rank == 0 else None)
    assert ctx.assigned_buffer == (None if comm.rank == 0 else 0)
    if comm.rank == 0:
        tg.send({"hello": 1}, 1)
    elif comm.rank == 1:
        assert tg.recv(0, timeout=30) == (0, {"hello": 1})
    ctx.cleanup()
    with pytest.raises(LayoutError, match="differs from the arguments"):
        tg.initialize_distributed_compute_mpi4py(0, layout=tg.RankLayout.build(comm.size, 1, 1, 1, 0))
