"""The compat modules (Spinning Up, OmniSafe, VirTex, EvoRL) at every world size.

Tests named ``..._original_...`` check a behaviour the original library gets
wrong (the docstring says how); the rest check the contract. Expected
values are closed forms in (rank, n).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gflowdist.compat import evorl, omnisafe, spinup, virtex
from gflowdist.ops.axes import bind_axis, unbind_axis
from tests.ranked.subgroups import my_half

# -- Spinning Up -------------------------------------------------------------------


def test_spinup_identity_and_mpi_avg(comm):
    n, r = comm.size, comm.rank
    assert (spinup.proc_id(), spinup.num_procs()) == (r, n)
    scalar = spinup.mpi_avg(float(r))
    assert np.isscalar(scalar) and scalar.dtype == np.float32 and scalar == pytest.approx((n - 1) / 2)
    vector = spinup.mpi_avg([r, 2 * r])
    assert vector.dtype == np.float32 and vector.tolist() == pytest.approx([(n - 1) / 2, n - 1])
    from_tensor = spinup.mpi_avg(torch.tensor([1.0 * r]))
    assert from_tensor.tolist() == pytest.approx([(n - 1) / 2])
    assert spinup.mpi_sum(1) == n


def test_spinup_statistics_pooled_population_std(comm):
    n, r = comm.size, comm.rank
    local = [float(r + 10 * j) for j in range(r + 1)]  # rank r holds r + 1 samples
    pooled = np.array([k + 10.0 * j for k in range(n) for j in range(k + 1)])
    mean, std, lo, hi = spinup.mpi_statistics_scalar(local, with_min_and_max=True)
    assert (mean, std) == (pytest.approx(pooled.mean()), pytest.approx(pooled.std(ddof=0)))
    assert (lo, hi) == (pooled.min(), pooled.max())


def test_spinup_statistics_empty_rank(comm):
    """Rank 0 holds nothing and the others one sample each; min/max use the +-inf identities."""
    n, r = comm.size, comm.rank
    local = [] if r == 0 else [float(r)]
    if n == 1:  # no sample anywhere: 0 / 0, which numpy warns of, as in the original
        with pytest.warns(RuntimeWarning, match="invalid value encountered"):
            mean, std, lo, hi = spinup.mpi_statistics_scalar(local, True)
        assert math.isnan(mean) and (lo, hi) == (math.inf, -math.inf)
        return
    mean, std, lo, hi = spinup.mpi_statistics_scalar(local, True)
    pooled = np.arange(1, n, dtype=float)
    assert (mean, std, lo, hi) == (pytest.approx(pooled.mean()), pytest.approx(pooled.std()), 1.0, n - 1.0)


def test_spinup_mpi_avg_grads_skips_none_original_crashes(comm):
    """The original does ``p.grad.numpy()`` on every parameter: AttributeError on a None grad."""
    n, r = comm.size, comm.rank
    model = torch.nn.Linear(2, 1)
    model.weight.grad = torch.full_like(model.weight, float(r))
    model.bias.grad = None
    spinup.mpi_avg_grads(model)
    assert torch.allclose(model.weight.grad, torch.full_like(model.weight, (n - 1) / 2))
    assert model.bias.grad is None


def test_spinup_sync_params_from_rank_0(comm):
    torch.manual_seed(comm.rank)
    model = torch.nn.Linear(3, 2)
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2)
    spinup.sync_params(model)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=False))


# -- OmniSafe ----------------------------------------------------------------------


def test_omnisafe_identity(comm):
    assert (omnisafe.get_rank(), omnisafe.world_size(), omnisafe.is_master()) == (comm.rank, comm.size, comm.rank == 0)


def test_omnisafe_dist_op_never_modifies_input_original_overwrites(comm):
    """The original all-reduces ``torch.as_tensor(value)`` in place: a float32 input becomes the sum."""
    n, r = comm.size, comm.rank
    x = torch.full((2,), float(r + 1))
    total = omnisafe.dist_sum(x)
    assert x.tolist() == [r + 1.0] * 2
    assert total.tolist() == [n * (n + 1) / 2] * 2 and total.dtype == torch.float32
    assert float(omnisafe.dist_avg(x)[0]) == pytest.approx((n + 1) / 2) and x.tolist() == [r + 1.0] * 2
    assert float(omnisafe.dist_max(r)) == n - 1 and float(omnisafe.dist_min(r)) == 0


def test_omnisafe_avg_tensor_zero_d_original_crashes(comm):
    """The original asserts ``len(value.shape) > 0`` (its own docstring example fails)."""
    n, r = comm.size, comm.rank
    x = torch.tensor(1.0 + r)
    assert omnisafe.avg_tensor(x) is None
    assert float(x) == pytest.approx((n + 1) / 2)


def test_omnisafe_statistics_uneven_scalar_min_max_original_needs_equal_lengths(comm):
    """The original reduces min/max element-wise (equal lengths needed, a vector comes back) and
    calls ``len`` on the input (a 0-d tensor raises)."""
    n, r = comm.size, comm.rank
    local = torch.arange(float(r + 1)) * (r + 1)  # r + 1 samples on rank r
    before = local.clone()
    pooled = np.concatenate([np.arange(k + 1) * (k + 1.0) for k in range(n)])
    mean, std, lo, hi = omnisafe.dist_statistics_scalar(local, with_min_and_max=True)
    assert all(t.shape == () and t.dtype == torch.float32 for t in (mean, std, lo, hi))
    assert float(mean) == pytest.approx(pooled.mean(), rel=1e-6)
    assert float(std) == pytest.approx(pooled.std(), rel=1e-6)
    assert (float(lo), float(hi)) == (pooled.min(), pooled.max())
    assert torch.equal(local, before)
    mean0, std0 = omnisafe.dist_statistics_scalar(torch.tensor(float(r)))
    assert float(mean0) == pytest.approx((n - 1) / 2) and float(std0) == pytest.approx(np.arange(n).std())


def test_omnisafe_grads_params_and_torch_style_aliases(comm):
    n, r = comm.size, comm.rank
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(r))
    model.weight.grad = torch.full_like(model.weight, 2.0 * r)
    omnisafe.avg_grads(model)
    assert torch.allclose(model.weight.grad, torch.full_like(model.weight, float(n - 1)))
    omnisafe.avg_params(model)
    assert torch.allclose(model.bias, torch.full_like(model.bias, (n - 1) / 2))
    x = torch.tensor([float(r)])
    omnisafe.all_reduce(x)
    assert float(x) == n * (n - 1) / 2
    slots = [torch.zeros(1) for _ in range(n)]
    assert omnisafe.all_gather(slots, torch.tensor([float(r)]), async_op=True).wait()
    assert [float(s) for s in slots] == list(range(n))
    y = torch.tensor([float(r)])
    omnisafe.broadcast(y, src=n - 1)
    assert float(y) == n - 1
    got = torch.zeros(2)
    parts = [torch.tensor([float(k), -float(k)]) for k in range(n)] if r == 0 else None
    omnisafe.scatter(got, parts, src=0)
    assert got.tolist() == [r, -r]
    bucket = [torch.zeros(1) for _ in range(n)] if r == 0 else None
    omnisafe.gather(torch.tensor([float(r * r)]), bucket, dst=0)
    if r == 0:
        assert [float(b) for b in bucket] == [k * k for k in range(n)]


# -- VirTex ------------------------------------------------------------------------


def test_virtex_identity_and_synchronize(comm):
    assert (virtex.get_rank(), virtex.get_world_size(), virtex.is_master_process()) == (
        comm.rank,
        comm.size,
        comm.rank == 0,
    )
    virtex.synchronize()
    assert virtex.gpu_mem_usage() >= 0


def test_virtex_average_nested_dict(comm):
    """The original handles one level of dict only."""
    n, r = comm.size, comm.rank
    losses = {
        "total": torch.tensor(float(r)),
        "parts": {"a": torch.full((2,), 2.0 * r), "b": torch.tensor([r], dtype=torch.float64)},
    }
    assert virtex.average_across_processes(losses) is None
    assert float(losses["total"]) == pytest.approx((n - 1) / 2)
    assert losses["parts"]["a"].tolist() == pytest.approx([n - 1.0] * 2)
    assert float(losses["parts"]["b"]) == pytest.approx((n - 1) / 2)
    single = torch.tensor([float(r + 1)])
    virtex.average_across_processes(single)
    assert float(single) == pytest.approx((n + 1) / 2)


def test_virtex_integer_raises_before_any_collective_original_leaves_sum(comm):
    """The original all-reduces first and then fails to divide in place: the int tensor keeps the sum."""
    r = comm.rank
    values = {"loss": torch.tensor(float(r)), "count": torch.tensor(r + 1)}
    with pytest.raises(TypeError, match="floating-point"):
        virtex.average_across_processes(values)
    assert float(values["loss"]) == r and int(values["count"]) == r + 1
    virtex.synchronize()  # every rank is still in step


# -- EvoRL -------------------------------------------------------------------------


def test_evorl_reductions(comm):
    n, r = comm.size, comm.rank
    x = torch.tensor([float(r), 1.0])
    assert evorl.pmean(x) is x and evorl.psum(x, None) is x
    assert evorl.pmean(x, evorl.DP_AXIS_NAME).tolist() == pytest.approx([(n - 1) / 2, 1.0])
    assert evorl.psum(x, evorl.POP_AXIS_NAME).tolist() == [n * (n - 1) / 2, n]
    assert evorl.pmax(x, "DP").tolist() == [n - 1, 1] and evorl.pmin(x, "DP").tolist() == [0, 1]
    assert x.tolist() == [r, 1.0]
    stacked = evorl.all_gather(torch.tensor([r, 2 * r]), "POP")
    assert stacked.tolist() == [[k, 2 * k] for k in range(n)]
    tiled = evorl.all_gather(torch.tensor([r, 2 * r]), "POP", tiled=True)
    assert tiled.tolist() == [v for k in range(n) for v in (k, 2 * k)]
    assert evorl.get_process_id() == r and evorl.get_global_ranks().tolist() == [r]
    assert evorl.is_dist_initialized() == (n > 1)


def test_evorl_split_keys_identical_everywhere(comm):
    keys = evorl.split_key_to_devices(42, ["d0", "d1", "d2"])
    assert len(set(keys.tolist())) == 3
    assert all(torch.equal(k, keys) for k in comm.all_gather(keys))


def test_evorl_bound_axes_follow_groups(comm, half):
    members = my_half(comm.rank, comm.size)
    bind_axis(evorl.DP_AXIS_NAME, half)
    try:
        got = evorl.pmean(torch.tensor([float(comm.rank)]), evorl.DP_AXIS_NAME)
        assert float(got) == pytest.approx(sum(members) / len(members))
    finally:
        unbind_axis(evorl.DP_AXIS_NAME)


def test_evorl_gradient_update_averages_over_dp(comm):
    n, r = comm.size, comm.rank
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)

    def loss_fn(m, scale):
        return (scale * m.weight).sum()

    update = evorl.gradient_update(loss_fn, opt, evorl.DP_AXIS_NAME)
    value, module, opt = update(opt, module, float(r + 1))
    assert float(value) == r + 1  # the local loss
    assert float(module.weight.detach()) == pytest.approx(1.0 - 0.5 * (n + 1) / 2)
    local_only = evorl.gradient_update(loss_fn, opt, None)
    local_only(opt, module, float(r + 1))
    assert float(module.weight.detach()) == pytest.approx(1.0 - 0.5 * (n + 1) / 2 - 0.5 * (r + 1))


def test_evorl_agent_gradient_update_with_aux(comm):
    n, r = comm.size, comm.rank
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(0.0)
    state = {"params": module, "steps": 0}
    opt = torch.optim.SGD(module.parameters(), lr=1.0)

    def loss_fn(agent_state, batch, key):
        loss = (agent_state["params"].weight * batch).sum()
        return loss, {"key": key}

    update = evorl.agent_gradient_update(loss_fn, opt, "DP", has_aux=True)
    (loss, aux), state, opt = update(opt, state, torch.tensor([float(r)]), 7)
    assert float(loss) == 0.0 and aux == {"key": 7}
    assert state["params"] is module and state["steps"] == 0
    assert float(module.weight.detach()) == pytest.approx(-(n - 1) / 2)


@pytest.mark.parametrize("vectorised", [False, True])
def test_evorl_shmap_population_gathered_everywhere(comm, vectorised):
    n = comm.size
    population = torch.arange(2 * n + 1, dtype=torch.float32)  # uneven shards
    offset = torch.tensor(0.5)
    run = (evorl.shmap_vmap if vectorised else evorl.shmap_map)(lambda x, c: (x * x + c, -x), in_specs=(True, None))
    squares, negatives = run(population, offset)
    assert squares.tolist() == (population * population + 0.5).tolist()
    assert negatives.tolist() == (-population).tolist()


def test_evorl_tree_device_put_keeps_structure(comm):
    tree = {"a": [torch.ones(1), (torch.zeros(2), 3)], "b": torch.tensor(2.0)}
    moved = evorl.tree_device_put(tree, "cpu")
    assert isinstance(moved["a"], list) and isinstance(moved["a"][1], tuple) and moved["a"][1][1] == 3
    assert moved["b"].device.type == "cpu"
