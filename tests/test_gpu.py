"""On a CUDA device (marker ``gpu``: skipped, with the reason, where torch sees none): pinned staging, weights
off the GPU once per publish, the slips named, HyperGrid sampling on the GPU, and whole runs with the learner
on the GPU and with 2 trainers sharing it (on both engines: never a hang or a crash inside nccl)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gflowdist.errors import GflowdistError
from gflowdist.runtime.staging import (
    BatchStager,
    DeviceMemoryError,
    HostWeights,
    check_model_device,
    naming_out_of_memory,
)
from tests.support.jobs import read_json
from tests.support.scripts import load_script

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HYPERGRID = EXAMPLES / "hypergrid" / "config.yaml"
#: the jobs' ranks see the GPUs this test process sees (tests/support/launching.base_env hides them otherwise)
GPUS = {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}


def batch(n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 16, generator=g), "keys": torch.arange(n)}


def test_by_default_a_batch_reaches_the_gpu_in_one_copy_per_field_and_the_source_is_free_at_once():
    stager = BatchStager("cuda:0")
    assert stager.direct and stager.stream is not None
    g = torch.Generator().manual_seed(2)
    pageable = torch.randn(1 << 23, generator=g)  # 32 MiB: long enough for a late copy to see the overwrite
    pinned = torch.randn(1 << 23, generator=g).pin_memory()
    kept = {"pageable": pageable.clone(), "pinned": pinned.clone()}
    out = stager.stage({"pageable": pageable, "pinned": pinned})
    pageable.zero_()
    pinned.zero_()  # the caller may reuse its tensors once stage() has returned
    for name, value in kept.items():
        assert out[name].device.type == "cuda" and torch.equal(out[name].cpu(), value), name
    assert all(not slot.flat for slot in stager.slots)  # no host buffers on this path


def test_pinned_staging_reaches_the_gpu_with_its_values():
    stager = BatchStager("cuda:0", pin_memory=True)
    assert stager.pin_memory and not stager.direct and stager.stream is not None
    batches = [batch(256, seed) for seed in range(5)]
    outs = [stager.stage(b) for b in batches]
    for b, out in zip(batches, outs, strict=True):
        assert out["x"].device.type == "cuda" and torch.equal(out["x"].cpu(), b["x"])
    assert all(buf.is_pinned() for slot in stager.slots for buf in slot.flat.values())
    assert sum(slot.allocations for slot in stager.slots) == 4  # 2 slots x 2 fields, reused after


@pytest.mark.parametrize("pin_memory", [None, True])
def test_the_step_right_after_staging_sees_the_whole_batch(pin_memory):
    stager = BatchStager("cuda:0", pin_memory=pin_memory)
    big = torch.randn(1 << 22, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = stager.stage({"x": big})
    total = out["x"].sum()  # on the compute stream, which waited for the copy stream
    assert float(total) == pytest.approx(float(big.sum()), rel=1e-9)


def test_weights_leave_the_gpu_once_per_publish_into_pinned_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64)).cuda()
    weights = HostWeights()
    snap = weights.snapshot(model, version=1)
    assert weights.snapshot(model, version=1) is snap and weights.copies == 1
    for name, value in model.state_dict().items():
        assert snap[name].device.type == "cpu" and snap[name].is_pinned()
        assert torch.equal(snap[name], value.cpu())


def test_a_cpu_model_in_a_cuda_trainer_is_named():
    with pytest.raises(GflowdistError, match="parameter 'weight' is on cpu, but the trainer computes on cuda:0"):
        check_model_device(torch.nn.Linear(2, 2), "cuda:0", owner="T.model of trainer rank 0")


def test_a_real_out_of_memory_error_is_named():
    expected = "trainer rank 0 ran out of memory on cuda:0 at step 3 with a batch of 7 items"
    with pytest.raises(DeviceMemoryError, match=expected):
        with naming_out_of_memory(0, 3, 7, "cuda:0"):
            torch.empty(1 << 50, device="cuda:0")  # 4 PiB


def test_hypergrid_samples_and_learns_on_the_gpu_with_a_cpu_generator():
    gfn = load_script(EXAMPLES / "hypergrid" / "hypergrid_gfn.py")
    env = gfn.HyperGrid(ndim=2, height=8)
    model = gfn.HyperGridPolicy(env).cuda()
    made = gfn.sample_trajectories(model, env, 32, torch.Generator().manual_seed(0), 0.1)
    assert gfn.check_batch(made, env) == 32 and all(t.device.type == "cuda" for t in made.values())
    assert torch.isfinite(gfn.tb_loss(model, env, made))


def test_a_run_with_its_learner_on_the_gpu(job_factory):
    job = job_factory(
        "-n", "3", "run.steps=40", "launch.devices=[cuda,cpu,cpu]", "layout.trainers=1", config=HYPERGRID, env=GPUS
    )
    assert job.wait(240) == 0, job.output
    run = job.run_dir()
    record = read_json(run / "devices.json")
    assert record["devices"]["0"].startswith("cuda:") and record["devices"]["1"] == "cpu"
    phases = read_json(run / "finals.json")["0"]["timing"]["phases"]
    assert phases.get("stage"), phases.keys()  # replayed items were staged onto the GPU


@pytest.mark.parametrize("engine", ["mpi", "torch"])
def test_two_trainers_sharing_the_gpu_average_through_host_memory(job_factory, engine):
    job = job_factory(
        "-n",
        "4",
        "--engine",
        engine,
        "run.steps=30",
        "layout.trainers=2",
        "sync.mode=gradients",
        "launch.devices=[cuda:0,cuda:0,cpu,cpu]",
        config=HYPERGRID,
        env=GPUS,
    )
    assert job.wait(240) == 0, job.output
    run = job.run_dir()
    (group,) = read_json(run / "devices.json")["averaging"]
    assert (group["path"], group["engine"]) == ("host", {"mpi": "mpi", "torch": "gloo"}[engine])
    assert "ranks 0 and 1 share cuda:0" in group["reason"]
    assert "averages through host memory" in (run / "report.txt").read_text()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices: each trainer on a GPU of its own")
def test_trainers_each_on_a_gpu_of_their_own_average_on_nccl(job_factory):
    job = job_factory(
        "-n",
        "4",
        "--engine",
        "torch",
        "run.steps=30",
        "layout.trainers=2",
        "sync.mode=gradients",
        "launch.devices=[cuda:0,cuda:1,cpu,cpu]",
        config=HYPERGRID,
        env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0,1")},
    )
    assert job.wait(240) == 0, job.output
    (group,) = read_json(job.run_dir() / "devices.json")["averaging"]
    assert (group["path"], group["engine"]) == ("nccl", "nccl"), group
