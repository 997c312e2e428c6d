"""Gradient averaging keeps every ``p.grad`` tensor: the one the caller holds receives the mean.

For every function that averages gradients (gflowdist's own, the four
compat modules', DistributedOptimizer's step), over several training steps:
the first call, after torch's default ``zero_grad()`` (gradients set to
None, backward makes new ones), after ``zero_grad(set_to_none=False)``, and
with gradients that are views into a buffer of the caller's (a flat-buffer
optimizer). Each time ``held = [p.grad ...]`` before the call, and after it
``held[i] is p.grad`` and holds the mean of the ranks' local gradients.
"""

from __future__ import annotations

import pytest
import torch

import gflowdist.compat.omnisafe as omnisafe
import gflowdist.compat.spinup as spinup
import gflowdist.compat.torchgfn as torchgfn
from gflowdist.ops import DistributedOptimizer, average_gradients


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def backward(model, comm, step: int) -> None:
    """A loss whose gradients differ between ranks and steps."""
    x = torch.linspace(-1, 1, 20).reshape(5, 4) * (comm.rank + 1) + step
    (model(x) ** 2).sum().backward()


def rank_mean(comm, grads) -> list[torch.Tensor]:
    flat = torch.cat([g.reshape(-1) for g in grads])
    mean = sum(comm.all_gather(flat)) / comm.size
    out, offset = [], 0
    for g in grads:
        out.append(mean[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    return out


def flat_buffer_grads(model) -> torch.Tensor:
    """Make every gradient a view into one buffer of the caller's (as flat-buffer optimizers do)."""
    params = list(model.parameters())
    buffer = torch.zeros(sum(p.numel() for p in params))
    offset = 0
    for p in params:
        view = buffer[offset : offset + p.numel()].view_as(p)
        view.copy_(p.grad)
        p.grad = view
        offset += p.numel()
    return buffer


AVERAGERS = {
    "ops.average_gradients": lambda model, opt: average_gradients(model),
    "spinup.mpi_avg_grads": lambda model, opt: spinup.mpi_avg_grads(model),
    "omnisafe.avg_grads": lambda model, opt: omnisafe.avg_grads(model),
    "torchgfn.average_gradients": lambda model, opt: torchgfn.average_gradients(model),
    "DistributedOptimizer.step": lambda model, opt: opt.step(),
}


@pytest.mark.parametrize("name", list(AVERAGERS))
def test_each_grad_keeps_its_identity_and_receives_the_mean(comm, name):
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    opt = DistributedOptimizer(sgd) if name.startswith("Distributed") else sgd
    average = AVERAGERS[name]
    earlier = None
    for step, zeroing in enumerate(["first call", "set_to_none", "zeros", "set_to_none", "flat buffer"]):
        opt.zero_grad(set_to_none=zeroing != "zeros")
        backward(model, comm, step)
        buffer = flat_buffer_grads(model) if zeroing == "flat buffer" else None
        held = [p.grad for p in model.parameters()]
        expected = rank_mean(comm, held)
        average(model, opt)
        for index, (p, grad, mean) in enumerate(zip(model.parameters(), held, expected, strict=False)):
            assert p.grad is grad, f"{zeroing}: parameter {index} got a new .grad tensor"
            assert torch.allclose(grad, mean, atol=1e-6), f"{zeroing}: parameter {index} does not hold the mean"
        if buffer is not None:  # the caller's buffer, through the views, holds the means too
            assert torch.allclose(buffer, torch.cat([m.reshape(-1) for m in expected]), atol=1e-6)
        if earlier is not None and zeroing == "set_to_none":
            # torch semantics: a gradient dropped by zero_grad() keeps its values for whoever holds it
            for grad, mean in zip(*earlier, strict=False):
                assert torch.allclose(grad, mean, atol=1e-6), "an old gradient was overwritten"
        earlier = (held, [m.clone() for m in expected])
        if not name.startswith("Distributed"):
            opt.step()
    parameters = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all(torch.equal(parameters, other) for other in comm.all_gather(parameters)), "replicas drifted"


def test_backward_moves_fresh_grads_into_the_bucket(comm):
    """After the first call, backward's new gradients are moved into the bucket: nothing to copy at the call."""
    model = make_model()
    backward(model, comm, 0)
    average_gradients(model)
    pointers = [p.grad.data_ptr() for p in model.parameters()]
    model.zero_grad()  # set_to_none: backward creates new tensors
    backward(model, comm, 1)
    moved = [p.grad.data_ptr() for p in model.parameters()]
    assert (moved == pointers) == (comm.size > 1), "a world of one installs no hook and moves nothing"


def test_parameters_listed_as_torch_lists_them():
    """The averagers read a module's parameters from its dicts: same tensors, same order, shared ones once."""
    from gflowdist.ops.averaging import parameters_of

    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 3), torch.nn.Sequential(shared, torch.nn.Linear(2, 2, bias=False)), shared, torch.nn.Module()
    )
    model[0].tied = model[0].weight  # one parameter under two names
    model.add_module("absent", None)
    for module in (model, torch.nn.TransformerEncoderLayer(8, 2), torch.nn.LSTM(3, 4, 2)):
        listed, expected = parameters_of(module), list(module.parameters())
        assert len(listed) == len(expected) and all(a is b for a, b in zip(listed, expected, strict=False))


def test_sparse_gradients_refused_on_every_rank_and_backward_unharmed(comm):
    if comm.size == 1:
        pytest.skip("a world of one averages nothing")
    model = torch.nn.Sequential(torch.nn.Embedding(5, 2, sparse=True), torch.nn.Linear(2, 1))
    model(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(TypeError, match="dense gradients only"):
        average_gradients(model)  # refused before any reduction, the same on every rank
    model.zero_grad()
    model(torch.tensor([3])).sum().backward()  # the hooks from the first call leave sparse gradients alone
    assert model[0].weight.grad.is_sparse and model[1].weight.grad is not None
    comm.barrier()
