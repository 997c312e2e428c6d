"""Gradient and model averaging, DistributedOptimizer, at every world size.

Rank r's gradients are (r + 1) * base, so their mean over n ranks is
(n + 1) / 2 * base; a rank without a gradient contributes zeros.
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.ops import DistributedOptimizer, GradientAverager, average_gradients, average_models, sync_params
from tests.ranked.subgroups import my_half


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def bases(model):
    return [torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) / 7 + i for i, p in enumerate(model.parameters())]


def set_grads(model, rank):
    for p, base in zip(model.parameters(), bases(model), strict=False):
        p.grad = (rank + 1) * base


def gathered_equal(comm, tensors) -> bool:
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    return all(torch.equal(other, flat) for other in comm.all_gather(flat))


def test_average_gradients_closed_form(comm):
    n = comm.size
    model = make_model()
    set_grads(model, comm.rank)
    average_gradients(model)
    for p, base in zip(model.parameters(), bases(model), strict=False):
        assert torch.allclose(p.grad, (n + 1) / 2 * base)
    assert gathered_equal(comm, [p.grad for p in model.parameters()])


def test_a_rider_travels_in_the_reduction_and_leaves_the_gradients_alone(comm):
    """Rank r's rider is r + 1 (their mean is (n + 1) / 2); the gradients' mean is what it is without one,
    in the very bits, across several buckets (a 64-byte cap cuts this model's parameters into four)."""
    n = comm.size
    bare, carrying = make_model(), make_model()
    for step in range(2):
        set_grads(bare, comm.rank + step)
        set_grads(carrying, comm.rank + step)
        assert average_gradients(bare, comm, bucket_cap_bytes=64) is None  # no rider, nothing returned
        mean = average_gradients(carrying, comm, bucket_cap_bytes=64, rider=float(comm.rank + 1 + step))
        assert mean == ((n + 1) / 2 + step if n > 1 else None)  # a group of one reduces nothing
        for a, b in zip(bare.parameters(), carrying.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
    assert average_gradients(torch.nn.Linear(2, 2).requires_grad_(False), comm, rider=1.0) is None  # nothing to ride


def exact_values(rank: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Rank ``rank``'s gradients: small integers times a power of two, normal and subnormal, so every sum
    over up to 4 ranks is exact (any order of the reduction gives it) and its quotient by 3 is not."""
    g = torch.Generator().manual_seed(100 + rank)
    k = torch.randint(-30, 31, (2, 64), generator=g, dtype=torch.int64).double()
    smallest = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # the smallest subnormal
    return [(k[0] * 0.125).to(dtype), (k[1] * smallest).to(dtype)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_mean_has_the_bits_of_the_sum_divided_by_n(comm, dtype):
    """What the originals compute, ``sum / n`` by torch's division, to the bit, at every world size (a power
    of two or not), for normal and subnormal values (where halving rounds)."""
    n = comm.size
    params = [torch.zeros(64, dtype=dtype, requires_grad=True) for _ in range(2)]
    for p, grad in zip(params, exact_values(comm.rank, dtype), strict=True):
        p.grad = grad
    average_gradients(params, comm)
    everyone = [exact_values(r, dtype) for r in range(n)]
    for index, p in enumerate(params):
        total = sum((values[index].double() for values in everyone), torch.zeros(64, dtype=torch.float64))
        assert torch.equal(total.to(dtype).double(), total)  # exact: the sum's bits do not depend on the order
        assert torch.equal(p.grad, total.to(dtype) / n)
    assert bool((params[1].grad != 0).any()) and bool((params[1].grad.abs() < torch.finfo(dtype).tiny).all())


def test_repeated_calls_reuse_bucket_views(comm):
    n = comm.size
    model = make_model()
    for step in range(3):
        set_grads(model, comm.rank + step)  # fresh tensors: copied into the bucket
        average_gradients(model)
        for p, base in zip(model.parameters(), bases(model), strict=False):
            assert torch.allclose(p.grad, ((n + 1) / 2 + step) * base)
    if n > 1:  # the grads are now views of one flat buffer: in-place accumulation lands in it
        pointers = [p.grad.data_ptr() for p in model.parameters()]
        for p in model.parameters():
            p.grad.zero_()
            p.grad.add_(torch.full_like(p, float(comm.rank)))
        average_gradients(model)
        assert [p.grad.data_ptr() for p in model.parameters()] == pointers
        for p in model.parameters():
            assert torch.allclose(p.grad, torch.full_like(p, (n - 1) / 2))


def test_none_grads_skipped_consistently(comm):
    """Rank 0 lacks the first weight's grad (others contribute theirs); no rank has the last bias's."""
    n, r = comm.size, comm.rank
    model = make_model()
    set_grads(model, r)
    params = list(model.parameters())
    if r == 0:
        params[0].grad = None
    params[-1].grad = None
    average_gradients(model)
    base = bases(model)
    if n == 1:
        assert params[0].grad is None  # a world of one leaves everything as it is
    else:
        assert torch.allclose(params[0].grad, sum(k + 1 for k in range(1, n)) / n * base[0])
    assert params[-1].grad is None
    for p, b in zip(params[1:-1], base[1:-1], strict=False):
        assert torch.allclose(p.grad, (n + 1) / 2 * b)


def test_small_buckets_and_mixed_dtypes(comm):
    n = comm.size
    params = [
        torch.nn.Parameter(torch.zeros(5)),
        torch.nn.Parameter(torch.zeros(3, dtype=torch.float64)),
        torch.nn.Parameter(torch.zeros(4)),
        torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)),
    ]
    averager = GradientAverager(params, bucket_cap_bytes=20)
    for k, p in enumerate(params):
        p.grad = torch.full_like(p, float(comm.rank * (k + 1)))
    averager()
    for k, p in enumerate(params):
        assert p.grad.dtype == p.dtype
        assert torch.allclose(p.grad, torch.full_like(p, (n - 1) / 2 * (k + 1)))


def test_subgroup_divides_by_its_own_size(comm, half):
    members = my_half(comm.rank, comm.size)
    model = make_model()
    set_grads(model, comm.rank)
    average_gradients(model, half)
    mean_factor = sum(k + 1 for k in members) / len(members)
    for p, base in zip(model.parameters(), bases(model), strict=False):
        assert torch.allclose(p.grad, mean_factor * base)


def test_layout_mismatch_raises_on_every_rank(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    model = torch.nn.Linear(3, 2 if comm.rank == 0 else 4)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="differ between ranks"):
        average_gradients(model)


def test_average_models_and_sync_params(comm):
    n, r = comm.size, comm.rank
    model = make_model(seed=r)
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            p.fill_(float(r * (k + 1)))
    average_models(model)
    for k, p in enumerate(model.parameters()):
        assert torch.allclose(p, torch.full_like(p, (n - 1) / 2 * (k + 1)))
    model = make_model(seed=100 + r)
    reference = [p.detach().clone() for p in make_model(seed=100 + n - 1).parameters()]
    sync_params(model, src=n - 1)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference, strict=False))
    sync_params(model)  # from rank 0: unchanged here since every rank now holds rank n-1's
    assert gathered_equal(comm, list(model.parameters()))


def rank_batch(rank: int):
    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(6, 4, generator=generator), torch.randn(6, 3, generator=generator)


def test_distributed_optimizer_matches_pooled_training(comm):
    """Same-size batches: averaged gradients equal the gradient of the pooled batch's mean loss."""
    n, r = comm.size, comm.rank
    model = make_model(seed=r)  # differs per rank until the optimizer syncs it
    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.05))
    reference = make_model(seed=0)
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    pooled_x = torch.cat([rank_batch(k)[0] for k in range(n)])
    pooled_y = torch.cat([rank_batch(k)[1] for k in range(n)])
    x, y = rank_batch(r)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        scheduler.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(pooled_x), pooled_y).backward()
        ref_opt.step()
        for group in ref_opt.param_groups:
            group["lr"] *= 0.5
    assert gathered_equal(comm, list(model.parameters()))
    for p, q in zip(model.parameters(), reference.parameters(), strict=False):
        assert torch.allclose(p, q, atol=1e-5)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 / 8)


def test_distributed_optimizer_with_closure(comm):
    n, r = comm.size, comm.rank
    weight = torch.nn.Parameter(torch.tensor([float(r)]))
    opt = DistributedOptimizer(torch.optim.SGD([weight], lr=1.0))
    assert float(weight.detach()) == 0.0  # synced from rank 0

    def closure():
        opt.zero_grad()
        loss = (r + 1) * weight.sum()
        loss.backward()
        return loss

    opt.step(closure)
    assert float(weight.detach()) == pytest.approx(-(n + 1) / 2)
