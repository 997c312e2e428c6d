"""gflowdist.compat.torchgfn in one process: names and signatures, torchgfn's rank rule, errors, loopback.

The rank rule is checked against a re-derivation of torchgfn's
``RankLayout.from_hostnames`` written here from its description (each host's
ranks, minus the coordinator, cut into ``B / H`` chunks of near-equal size
whose last rank is the buffer; ``RankLayout.build`` is the one-host case).
"""

from __future__ import annotations

import inspect
import itertools
import pickle

import numpy as np
import pytest
import torch

import gflowdist.compat.torchgfn as tg
from gflowdist.comm.native import NotAMemberError
from gflowdist.compat.torchgfn_context import torchgfn_layout_config
from gflowdist.compat.torchgfn_groups import world_for
from gflowdist.errors import ConfigError, DeadlineError, GflowdistError, LayoutError, ProtocolError
from gflowdist.layout import plan_layout
from gflowdist.transport import EncodeError

# -- names and parameters (as in torchgfn's src/gfn/utils/distributed.py) ------------------

TORCHGFN_PARAMETERS = {
    "send": [("data", None), ("dst_rank", None), ("backend", "mpi"), ("tag", 0)],
    "isend": [("data", None), ("dst_rank", None), ("backend", "mpi"), ("tag", 0)],
    "recv": [("src_rank", None), ("backend", "mpi"), ("tag", 0)],
    "barrier": [("backend", "mpi"), ("group", None)],
    "get_rank": [("backend", "mpi"), ("group", None)],
    "get_world_size": [("backend", "mpi"), ("group", None)],
    "all_reduce": [("tensor", None), ("op", "SUM"), ("backend", "mpi"), ("group", None)],
    "all_gather": [("output_list", None), ("tensor", None), ("backend", "mpi"), ("group", None)],
    "broadcast": [("tensor", None), ("src", None), ("backend", "mpi"), ("group", None)],
    "gather_distributed_data": [("local_tensor", None), ("world_size", None), ("rank", None), ("training_group", None)],
    "average_gradients": [("model", None)],
    "average_models": [("model", None), ("training_group", None)],
    "initialize_distributed_compute": [
        ("dist_backend", None),
        ("num_remote_buffers", None),
        ("num_agent_groups", 1),
        ("use_coordinator", False),
    ],
    "initialize_distributed_compute_mpi4py": [
        ("num_remote_buffers", None),
        ("num_agent_groups", 1),
        ("num_coordinators", 0),
        ("layout", None),
    ],
    "report_load_imbalance": [("all_timing_dict", None), ("world_size", None)],
    "report_time_info": [("all_timing_dict", None), ("world_size", None)],
}
CONTEXT_FIELDS = [
    "my_rank",
    "world_size",
    "num_training_ranks",
    "agent_group_size",
    "agent_groups",
    "agent_group_id",
    "train_global_group",
    "assigned_buffer",
    "buffer_group",
    "assigned_training_ranks",
]


@pytest.mark.parametrize("name", sorted(TORCHGFN_PARAMETERS))
def test_same_parameters_as_torchgfn(name):
    params = list(inspect.signature(getattr(tg, name)).parameters.values())
    expected = TORCHGFN_PARAMETERS[name]
    assert [(p.name, None if p.default is p.empty else p.default) for p in params[: len(expected)]] == expected
    assert all(p.default is not p.empty for p in params[len(expected) :]), "extra parameters must be optional"


def test_every_public_name_is_there():
    for name in ("DistributedContext", "DistributedContextMPI4Py", "AsyncSendHandle", *TORCHGFN_PARAMETERS):
        assert name in tg.__all__ and hasattr(tg, name)
    assert tg.default_backend == "mpi"


def test_context_fields_and_hand_built_single_process_context():
    torch_fields = list(tg.DistributedContext.__dataclass_fields__)
    mpi_fields = list(tg.DistributedContextMPI4Py.__dataclass_fields__)
    # torchgfn's order (positional construction keeps working), then gflowdist's ``core``
    assert torch_fields == [
        *CONTEXT_FIELDS,
        "dc_mpi4py",
        "coordinator_rank",
        "buffer_rank_set",
        "training_ranks",
        "core",
    ]
    assert mpi_fields == [*CONTEXT_FIELDS, "buffer_rank_set", "coordinator_rank", "core"]
    # what torchgfn's HyperGrid script builds when it is not distributed
    ctx = tg.DistributedContext(my_rank=0, world_size=1, num_training_ranks=1, agent_group_size=1)
    assert ctx.is_training_rank() and not ctx.is_buffer_rank() and not ctx.is_coordinator_rank()
    assert ctx.get_train_group("torch") is None and ctx.get_train_group("mpi") is None
    with pytest.raises(ConfigError, match="backend"):
        ctx.get_train_group("nccl")
    ctx.cleanup()
    ctx.cleanup()


def test_role_predicates_follow_torchgfn():
    coordinator = tg.DistributedContext(
        my_rank=3, world_size=4, num_training_ranks=2, agent_group_size=2, buffer_rank_set={2}, coordinator_rank=3
    )
    assert coordinator.is_coordinator_rank()
    assert not coordinator.is_buffer_rank() and not coordinator.is_training_rank()
    buffer = tg.DistributedContextMPI4Py(
        my_rank=2, world_size=4, num_training_ranks=2, agent_group_size=2, buffer_rank_set={2}, coordinator_rank=3
    )
    assert buffer.is_buffer_rank() and not buffer.is_training_rank() and not buffer.is_coordinator_rank()
    with pytest.raises(GflowdistError, match="no MPI groups"):
        coordinator.get_train_group("mpi")


# -- torchgfn's rank rule -------------------------------------------------------------------


def split_ceil_floor(total, parts):
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def torchgfn_reference(world, buffers, groups, coordinators, hosts):
    """torchgfn's layout: (trainers, {trainer: buffer}, {buffer: clients}, agent groups).

    Returns None where torchgfn's node-local placement raises (a host too small).
    """
    trainer_count = world - buffers - coordinators
    if buffers == 0:
        trainers = list(range(trainer_count))
        chunks = []
    else:
        host_order = list(dict.fromkeys(hosts))
        if buffers % len(host_order):
            host_order, hosts = ["one"], ["one"] * world  # torchgfn falls back to build()
        per_host = buffers // len(host_order)
        chunks = []
        for host in host_order:
            ranks = [r for r in range(world - coordinators) if hosts[r] == host]
            if len(ranks) < 2 * per_host:
                return None
            start = 0
            for size in split_ceil_floor(len(ranks), per_host):
                chunks.append(ranks[start : start + size])
                start += size
        trainers = [r for chunk in chunks for r in chunk[:-1]]
    size = len(trainers) // groups
    return (
        trainers,
        {r: c[-1] for c in chunks for r in c[:-1]},
        {c[-1]: c[:-1] for c in chunks},
        [trainers[i * size : (i + 1) * size] for i in range(groups)],
    )


def ours(world, buffers, groups, coordinators, hosts):
    layout = plan_layout(world, torchgfn_layout_config(buffers, groups, coordinators), hosts, fallback_to_block=True)
    return (
        list(layout.trainers),
        dict(layout.buffer_of),
        {b: list(c) for b, c in layout.clients_of.items()},
        [list(g) for g in layout.agent_groups],
    )


def host_patterns(world):
    yield ["n0"] * world
    half = world // 2
    yield ["n0"] * half + ["n1"] * (world - half)
    yield [f"n{r % 2}" for r in range(world)]  # round-robin hosts
    if world >= 6:
        yield ["n0"] * 2 + ["n1"] * (world - 2)  # very uneven
        third = world // 3
        yield ["n0"] * third + ["n1"] * third + ["n2"] * (world - 2 * third)


def valid_shapes(world):
    for buffers, coordinators in itertools.product(range(world), (0, 1)):
        trainers = world - buffers - coordinators
        if trainers < max(buffers, 1):
            continue
        for groups in range(1, trainers + 1):
            if trainers % groups == 0:
                yield buffers, groups, coordinators


def loads_balanced(reference):
    loads = [len(c) for c in reference[2].values()]
    return not loads or max(loads) - min(loads) <= 1


def test_block_rule_example_from_torchgfn():
    trainers, buffer_of, clients_of, _ = ours(8, 3, 1, 0, None)
    assert buffer_of == {0: 2, 1: 2, 3: 5, 4: 5, 6: 7}
    assert trainers == [0, 1, 3, 4, 6] and clients_of == {2: [0, 1], 5: [3, 4], 7: [6]}
    assert ours(6, 0, 5, 1, None)[0] == [0, 1, 2, 3, 4]  # no buffers: trainers 0..T-1, coordinator 5


@pytest.mark.parametrize("world", range(2, 13))
def test_rank_assignment_matches_torchgfn(world):
    compared = 0
    for hosts in host_patterns(world):
        for buffers, groups, coordinators in valid_shapes(world):
            reference = torchgfn_reference(world, buffers, groups, coordinators, hosts)
            if reference is None or not loads_balanced(reference):
                # Known difference: torchgfn raises (host too small) or places buffers with
                # loads differing by more than one; gflowdist uses the arithmetic rule then.
                reference = torchgfn_reference(world, buffers, groups, coordinators, ["one"] * world)
            assert ours(world, buffers, groups, coordinators, hosts) == reference, (
                world,
                buffers,
                groups,
                coordinators,
                hosts,
            )
            compared += 1
    assert compared > 0


@pytest.mark.parametrize("buffers,groups,coordinators", [(3, 1, 0), (1, 2, 0), (2, 1, 1), (0, 3, 0)])
def test_layouts_torchgfn_rejects_are_rejected(buffers, groups, coordinators):
    # W=4: more buffers than trainers, or trainers not divisible into the agent groups
    with pytest.raises(LayoutError):
        ours(4, buffers, groups, coordinators, None)


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"num_remote_buffers": -1}, "num_remote_buffers"),
        ({"num_remote_buffers": 1, "num_agent_groups": 0}, "num_agent_groups"),
        ({"num_remote_buffers": 1, "num_coordinators": 2}, "num_coordinators"),
    ],
)
def test_counts_are_validated(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        tg.initialize_distributed_compute_mpi4py(**kwargs)


# -- world of one -----------------------------------------------------------------------------


def test_single_process_mode_ignores_buffers_like_torchgfn():
    for ctx in (
        tg.initialize_distributed_compute("gloo", num_remote_buffers=2, num_agent_groups=1, use_coordinator=True),
        tg.initialize_distributed_compute_mpi4py(2, 1, 1),
    ):
        assert (ctx.my_rank, ctx.world_size, ctx.num_training_ranks, ctx.agent_group_size) == (0, 1, 1, 1)
        assert ctx.is_training_rank() and ctx.assigned_buffer is None and ctx.coordinator_rank is None
        assert ctx.agent_group_id == 0 and len(ctx.agent_groups) == 1
        assert tg.get_world_size(group=ctx.train_global_group) == 1 == tg.get_world_size(group=ctx.agent_groups[0])
        ctx.cleanup()
        ctx.cleanup()


def test_bad_backend_names_raise():
    with pytest.raises(ConfigError, match="dist_backend"):
        tg.initialize_distributed_compute("nccl", 0)
    for call in (lambda: tg.barrier("nccl"), lambda: tg.send(b"x", 0, backend="tcp"), lambda: tg.get_rank("MPI")):
        with pytest.raises(ConfigError, match="backend"):
            call()
    with pytest.raises(ValueError, match="unsupported reduction"):
        tg.all_reduce(torch.ones(2), op="PROD")
    with pytest.raises(TypeError, match="group must be"):
        tg.barrier(group="world")


def test_non_member_handle_reports_minus_one_and_refuses_collectives():
    """What torch gives a rank outside a group: get_rank/get_world_size say -1, collectives raise."""
    import torch.distributed as dist

    outside = dist.GroupMember.NON_GROUP_MEMBER
    assert tg.get_rank(group=outside) == -1 and tg.get_world_size("torch", group=outside) == -1
    with pytest.raises(NotAMemberError, match="all_reduce: this rank is not a member of the group"):
        tg.all_reduce(torch.ones(1), group=outside)
    with pytest.raises(NotAMemberError, match="average_models: this rank is not a member"):
        tg.average_models(torch.nn.Linear(1, 1), training_group=outside)


def test_hand_built_context_follows_torchgfn_2_4_1():
    """torchgfn 2.4.1's DDP scripts build the context by hand: ranks past the trainers are buffers."""
    ctx = tg.DistributedContext(
        my_rank=3,
        world_size=4,
        num_training_ranks=3,
        agent_group_size=3,
        train_global_group=None,
        assigned_training_ranks=[0, 1, 2],
    )
    assert ctx.is_buffer_rank() and not ctx.is_training_rank() and ctx.buffer_rank_set == {3}
    trainer = tg.DistributedContext(my_rank=1, world_size=4, num_training_ranks=3, agent_group_size=3)
    assert trainer.is_training_rank() and not trainer.is_buffer_rank()
    assert tg.DistributedContextmpi4py is tg.DistributedContextMPI4Py  # 2.4.1's spelling


def test_loopback_payloads_and_channels():
    payload = torch.frombuffer(bytearray(b"torchgfn message bytes"), dtype=torch.uint8)
    handle = tg.isend(payload, 0, tag=1)
    handle.wait(timeout=5)
    assert handle.is_complete()
    tg.send({"score": 1.5, "retained_count": 3, "states": torch.arange(6).reshape(2, 3)}, 0)
    tg.send((1, "two", np.float32(3.0)), 0, backend="torch", tag=0)
    source, score = tg.recv(tag=0)  # channel 0 first although channel 1 was sent first
    assert source == 0 and score["score"] == 1.5 and score["retained_count"] == 3
    assert torch.equal(score["states"], torch.arange(6).reshape(2, 3))
    assert tg.recv(0, tag=0)[1] == [1, "two", 3.0]
    source, data = tg.recv(0, tag=1)
    assert data.dtype == torch.uint8 and bytes(data.numpy()) == b"torchgfn message bytes"
    with pytest.raises(DeadlineError):
        tg.recv(tag=0, timeout=0.05)


class Opaque:
    pass


def test_values_the_wire_does_not_carry_raise_before_sending():
    for value in ({1, 2}, Opaque(), {"nested": [Opaque()]}, {3: "int key"}):
        with pytest.raises(EncodeError, match="never pickles"):
            tg.send(value, 0)
    with pytest.raises(DeadlineError):
        tg.recv(tag=0, timeout=0.05)  # nothing went out


def test_no_pickle_on_the_way(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    for name in ("dumps", "loads", "dump", "load", "Pickler", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    tg.send({"message_type": "DATA", "message_data": {"x": torch.ones(3)}}, 0)
    assert torch.equal(tg.recv(0)[1]["message_data"]["x"], torch.ones(3))


def test_bytes_that_are_not_a_message_raise_protocol_error():
    world_for("mpi").send(b"\x80\x04pickled?", 0, 2)
    with pytest.raises(ProtocolError) as info:
        tg.recv(tag=2)
    assert info.value.sender == 0


def test_collectives_in_a_world_of_one():
    x = torch.tensor([1.0, 2.0])
    tg.all_reduce(x, "AVG")
    tg.broadcast(x, src=0, backend="torch")
    assert x.tolist() == [1.0, 2.0]
    out = [torch.zeros(2)]
    tg.all_gather(out, x)
    assert torch.equal(out[0], x)
    with pytest.raises(ValueError, match="output_list holds 2 tensors"):
        tg.all_gather([torch.zeros(2), torch.zeros(2)], x)
    with pytest.raises(ValueError, match="shape"):
        tg.all_gather([torch.zeros(3)], x)
    tg.barrier()
    assert (tg.get_rank(), tg.get_world_size("torch")) == (0, 1)


def test_gather_distributed_data_checks_its_arguments():
    rows = torch.zeros(2, 3, 4, dtype=torch.bool)  # torchgfn: batch sizes in the data's dtype, 2-d only
    assert torch.equal(tg.gather_distributed_data(rows), rows)
    with pytest.raises(ValueError, match="world_size=2"):
        tg.gather_distributed_data(rows, world_size=2)
    with pytest.raises(ValueError, match="rank=1"):
        tg.gather_distributed_data(rows, rank=1)


def test_averaging_skips_missing_gradients_and_keeps_identical_weights():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    model[1].bias.grad = None  # torchgfn's average_gradients: AttributeError on None grads
    before = [p.detach().clone() for p in model.parameters()]
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    tg.average_gradients(model)
    tg.average_models(model)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False))
    assert [None if g is None else g.tolist() for g in grads] == [
        None if p.grad is None else p.grad.tolist() for p in model.parameters()
    ]


def test_reports_are_gflowdist_timing():
    from gflowdist import timing

    assert tg.report_load_imbalance is timing.report_load_imbalance
    assert tg.report_time_info is timing.report_time_info
    result = tg.report_load_imbalance([{"step": [1.0, 3.0]}, {"step": [3.0, 1.0]}], 2)
    assert "step" in result.text
