"""How an agent group averages, chosen at start-up with real ranks (gflowdist.devices.choose_averaging).

Every rank *claims* a device (the context only gathers the strings, so no GPU is
needed): trainers that claim one GPU between them average through host memory on
the job's engine (MPI, or gloo for the torch engine), and that average is right.
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.comm import ReduceOp
from gflowdist.context import DistributedContext
from gflowdist.devices import HOST_ENGINES
from gflowdist.runtime.device_record import device_notes, devices_record

ALL_TRAINERS = {"trainers": "rest", "buffers": 0, "coordinator": False}


def test_trainers_sharing_a_gpu_average_through_host_memory(comm):
    ctx = DistributedContext.create(ALL_TRAINERS, comm=comm, device="cuda:0")
    assert ctx.devices == ["cuda:0"] * comm.size
    (choice,) = ctx.averaging
    if comm.size == 1:
        assert choice.path == "none"
    else:
        assert (choice.path, choice.engine) == ("host", HOST_ENGINES[comm.engine])
        assert "ranks 0 and 1 share cuda:0" in choice.reason
        x = torch.tensor([float(comm.rank), 1.0])
        ctx.comm("DP").all_reduce(x, ReduceOp.AVG)
        assert x.tolist() == pytest.approx([(comm.size - 1) / 2, 1.0])
    record = devices_record(ctx)
    assert record["devices"] == {str(r): "cuda:0" for r in range(comm.size)}
    assert record["averaging"][0]["ranks"] == list(range(comm.size))
    notes = device_notes(ctx)
    if comm.size == 1:
        assert notes == []  # a group of one: nothing to say
    else:
        (note,) = notes
        assert note == (
            f"agent group 0 (trainers {', '.join(map(str, range(comm.size)))} on cuda:0) averages through "
            f"host memory on {HOST_ENGINES[comm.engine]}: {choice.reason}"
        )
    ctx.cleanup()
    comm.barrier()


def test_a_trainer_on_the_cpu_keeps_its_group_on_host_memory(comm):
    ctx = DistributedContext.create(ALL_TRAINERS, comm=comm, device="cuda:0" if comm.rank == 0 else "cpu")
    (choice,) = ctx.averaging
    if comm.size > 1:
        assert choice.path == "host"
        assert "on the CPU: nccl needs every trainer of the group on a GPU" in choice.reason
        assert device_notes(ctx)[0].endswith(choice.describe())
    ctx.cleanup()
    comm.barrier()


def test_without_a_device_nothing_is_gathered(comm):
    ctx = DistributedContext.create(ALL_TRAINERS, comm=comm)
    assert ctx.devices == [] and ctx.averaging == [] and device_notes(ctx) == []
    ctx.cleanup()
    comm.barrier()
