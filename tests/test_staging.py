"""The trainer's data path (gflowdist.runtime.staging) on the CPU: staging with pin_memory off, weights off
the device once per publish, the model's device check and the naming of an out-of-memory error."""

from __future__ import annotations

import pytest
import torch

from gflowdist.errors import GflowdistError
from gflowdist.runtime.staging import (
    BatchStager,
    DeviceMemoryError,
    DevicePath,
    HostWeights,
    check_model_device,
    naming_out_of_memory,
)
from gflowdist.timing import StepTimer


def batch(n: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 4, generator=g), "keys": torch.arange(n), "note": "not a tensor"}


def test_on_the_cpu_a_batch_is_used_as_it_is():
    stager = BatchStager("cpu")
    b = batch(8)
    out = stager.stage(b)
    assert out["x"] is b["x"] and out["keys"] is b["keys"]
    assert not stager.active and stager.batches == 0
    assert stager.stage(None) is None


def test_staging_copies_into_reused_buffers_and_hands_fresh_tensors():
    stager = BatchStager("cpu", pin_memory=False, copy_on_cpu=True, slots=2)
    batches = [batch(8, seed) for seed in range(5)]
    outs = [stager.stage(b) for b in batches]
    for b, out in zip(batches, outs, strict=True):  # earlier outputs survive the reuse of their slot
        assert torch.equal(out["x"], b["x"]) and torch.equal(out["keys"], b["keys"])
        assert out["x"].data_ptr() != b["x"].data_ptr()
        assert out["note"] == "not a tensor"
    # two slots, two tensor fields: four buffers made once, then reused for every later batch
    assert sum(s.allocations for s in stager.slots) == 4
    staging = {s.flat["x"].data_ptr() for s in stager.slots}
    assert all(out["x"].data_ptr() not in staging for out in outs)  # never a view of a staging buffer
    assert stager.batches == 5 and stager.bytes == 5 * (8 * 4 * 4 + 8 * 8)


def test_by_default_each_field_is_copied_once_with_no_host_buffers():
    stager = BatchStager("cpu", copy_on_cpu=True)  # the GPU's default path, with the CPU in its place
    assert stager.direct and not stager.pin_memory
    b = batch(8)
    out = stager.stage(b)
    kept = {k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)}
    for name in kept:
        b[name].zero_()  # the caller may reuse its tensors once stage() has returned
    for name, value in kept.items():
        assert torch.equal(out[name], value) and out[name].data_ptr() != b[name].data_ptr()
    assert out["note"] == "not a tensor" and all(not s.flat for s in stager.slots)
    assert stager.batches == 1 and stager.bytes == 8 * 4 * 4 + 8 * 8
    assert not BatchStager("cpu", pin_memory=False, copy_on_cpu=True).direct


def test_a_bigger_batch_grows_its_buffer_and_a_smaller_one_reuses_it():
    stager = BatchStager("cpu", pin_memory=False, copy_on_cpu=True, slots=1)
    stager.stage(batch(4))
    out = stager.stage(batch(16, seed=1))
    assert stager.slots[0].allocations == 4 and torch.equal(out["x"], batch(16, seed=1)["x"])
    small = stager.stage(batch(2, seed=2))
    assert stager.slots[0].allocations == 4 and small["x"].shape == (2, 4)
    assert torch.equal(small["x"], batch(2, seed=2)["x"])
    retyped = stager.stage({"x": torch.ones(3, dtype=torch.float64)})
    assert stager.slots[0].allocations == 5 and retyped["x"].dtype == torch.float64


def test_non_contiguous_fields_are_staged_with_their_values():
    stager = BatchStager("cpu", pin_memory=False, copy_on_cpu=True)
    x = torch.arange(24.0).reshape(4, 6)[:, ::2]
    out = stager.stage({"x": x})
    assert torch.equal(out["x"], x) and out["x"].is_contiguous()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no GPU")
def test_pinned_staging_without_cuda_is_refused_in_one_line():
    with pytest.raises(GflowdistError, match="pinned staging needs CUDA"):
        BatchStager("cpu", pin_memory=True)


def test_weights_leave_the_device_once_per_publish_into_reused_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    weights = HostWeights(pin_memory=False, copy_on_cpu=True)
    first = weights.snapshot(model, version=1)
    again = weights.snapshot(model, version=1)  # the coordinator's publish at the same version
    assert again is first and weights.copies == 1
    pointers = {k: v.data_ptr() for k, v in first.items()}
    with torch.no_grad():
        model[0].weight.add_(1.0)
    second = weights.snapshot(model, version=2)
    assert weights.copies == 2
    assert {k: v.data_ptr() for k, v in second.items()} == pointers  # the same host buffers
    for name, value in model.state_dict().items():
        assert torch.equal(second[name], value) and second[name].data_ptr() != value.data_ptr()


def test_weights_already_on_the_host_are_not_copied():
    model = torch.nn.Linear(3, 2)
    weights = HostWeights()
    snap = weights.snapshot(model, version=0)
    assert weights.copies == 0 and snap["weight"].data_ptr() == model.weight.data_ptr()


def test_a_parameter_on_another_device_is_named():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
    check_model_device(model, "cpu", owner="M.model of trainer rank 0")  # all on the CPU: fine
    model[1].to("meta")
    with pytest.raises(GflowdistError) as err:
        check_model_device(model, "cpu", owner="M.model of trainer rank 0")
    text = str(err.value)
    assert "M.model of trainer rank 0: parameter '1.weight' is on meta" in text and "computes on cpu" in text


def test_a_buffer_on_another_device_is_named():
    model = torch.nn.BatchNorm1d(2)
    model.running_mean = model.running_mean.to("meta")
    with pytest.raises(GflowdistError, match="buffer 'running_mean' is on meta"):
        check_model_device(model, "cpu", owner="B.model")


def test_device_path_checks_the_model_at_its_first_step_only():
    class Role:
        model = torch.nn.Linear(2, 2, device="meta")

    path = DevicePath("cpu")
    with pytest.raises(GflowdistError, match=r"Role\.model of trainer rank 3: parameter 'weight' is on meta"):
        path.check_once(Role(), 3)
    path.check_once(Role(), 3)  # checked once: later steps pay nothing


def test_out_of_memory_is_named_with_rank_step_and_batch_size():
    path = DevicePath("cpu")
    with pytest.raises(DeviceMemoryError) as err:
        with path.out_of_memory(2, 17, batch(64)):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    text = str(err.value)
    assert "trainer rank 2 ran out of memory on cpu at step 17 with a batch of 64 items" in text
    assert "Tried to allocate 2.00 GiB" in text
    assert isinstance(err.value.__cause__, torch.OutOfMemoryError)


def test_other_errors_pass_through_unchanged():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        with naming_out_of_memory(0, 1, 8, "cpu"):
            raise RuntimeError("shape mismatch")


def test_staging_is_timed_only_where_it_copies():
    timer = StepTimer()
    DevicePath("cpu", timer=timer).stage(batch(4))
    assert "stage" not in timer.phases
    DevicePath("cpu", timer=timer, copy_on_cpu=True, pin_memory=False).stage(batch(4))
    assert len(timer.phases["stage"]) == 1
