"""DistributedContext built for real: sub-communicator membership checked through collectives."""

from __future__ import annotations

import pytest
import torch

from gflowdist.comm import ReduceOp
from gflowdist.context import DistributedContext
from gflowdist.errors import LayoutError
from gflowdist.layout import Role, plan_layout


def layout_cfg(size):
    if size >= 4:
        coordinator = size % 2 == 0  # leaves an even number of trainers: two agent groups
        return {"trainers": "rest", "buffers": 1, "coordinator": coordinator, "agent_groups": 2}
    if size >= 2:
        return {"trainers": "rest", "buffers": 1, "coordinator": False}
    return {"trainers": 1, "buffers": 0, "coordinator": False}


def test_context_roles_and_groups(comm):
    cfg = layout_cfg(comm.size)
    ctx = DistributedContext.create(cfg, comm=comm)
    expected = plan_layout(comm.size, cfg)
    assert ctx.role is expected.role_of(comm.rank)
    # membership by collectives: sum of world ranks over each named group
    for name, members in (("trainers", expected.trainers), ("POP", expected.pop_ranks), ("buffers", expected.buffers)):
        sub = ctx.comm(name)
        if comm.rank in members:
            x = torch.tensor([float(comm.rank)])
            sub.all_reduce(x, ReduceOp.SUM)
            assert float(x) == sum(members) and sub.size == len(members)
        else:
            assert sub is None
    dp = ctx.comm("DP")
    if ctx.role is Role.TRAINER:
        group = expected.agent_groups[expected.group_of[comm.rank]]
        x = torch.tensor([float(comm.rank)])
        dp.all_reduce(x, ReduceOp.AVG)
        assert float(x) == pytest.approx(sum(group) / len(group))
    else:
        assert dp is None
    ctx.cleanup()
    ctx.cleanup()  # idempotent
    comm.barrier()


def test_mismatched_configs_fail_on_every_rank(comm):
    if comm.size == 1:
        pytest.skip("a disagreement needs two ranks")
    cfg = {"trainers": "rest", "buffers": 1 if comm.rank == 0 else 0, "coordinator": False}
    with pytest.raises(LayoutError, match="different layouts"):
        DistributedContext.create(cfg, comm=comm)
    comm.barrier()


def test_impossible_layout_raises_same_error_everywhere(comm):
    with pytest.raises(LayoutError, match="ranks"):
        DistributedContext.create({"trainers": comm.size + 1, "buffers": 0, "coordinator": False}, comm=comm)
    comm.barrier()
