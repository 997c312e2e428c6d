"""gflowdist.ops collectives, statistics, gathers and seeds at every world size.

Every rank builds every other rank's data from (rank, n), so expected values
are computed locally (numpy on the concatenated samples) and every rank
asserts the same thing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist

from gflowdist.comm import ReduceOp
from gflowdist.ops import (
    all_gather,
    as_reduce_op,
    avg_tensor,
    barrier,
    broadcast,
    dist_avg,
    dist_max,
    dist_min,
    dist_op,
    dist_sum,
    gather_distributed_data,
    rank_seed,
    rank_seeds,
    seed_rank,
    statistics_scalar,
)
from tests.ranked.subgroups import my_half


def samples_of(rank: int) -> np.ndarray:
    """Rank r holds r samples (rank 0 none): uneven and empty ranks, values that differ per rank."""
    return np.array([(rank + 1) * 1.5 - j * 0.25 for j in range(rank)], dtype=np.float64)


def test_reductions_closed_forms(comm):
    n, r = comm.size, comm.rank
    assert float(dist_sum(r + 1)) == n * (n + 1) / 2
    assert float(dist_max(r)) == n - 1
    assert float(dist_min(r)) == 0
    assert float(dist_avg(r)) == pytest.approx((n - 1) / 2)
    vector = dist_sum([r, 1.0])
    assert vector.dtype == torch.float32 and vector.tolist() == [n * (n - 1) / 2, n]
    assert dist_sum(r + 1).shape == ()


def test_reductions_leave_input_alone(comm):
    n, r = comm.size, comm.rank
    x = torch.full((3,), float(r + 1))
    out = dist_sum(x)
    assert out is not x and out.data_ptr() != x.data_ptr()
    assert x.tolist() == [r + 1.0] * 3
    assert out.tolist() == [n * (n + 1) / 2] * 3
    out.add_(1)  # the result is the caller's, not a view of the input
    assert x.tolist() == [r + 1.0] * 3
    arr = np.full(2, r, dtype=np.float64)
    assert dist_max(arr).tolist() == [n - 1] * 2 and arr.tolist() == [r, r]


@pytest.mark.parametrize("op", ["max", "MAX", ReduceOp.MAX, torch_dist.ReduceOp.MAX])
def test_reduce_op_spellings(comm, op):
    assert float(dist_op(comm.rank, op)) == comm.size - 1


def test_reduce_op_mpi_constants(comm):
    mpi = pytest.importorskip("mpi4py.MPI") if comm.engine == "mpi" else None
    if mpi is None:
        pytest.skip("mpi4py constants are only translated when the caller uses mpi4py")
    assert as_reduce_op(mpi.MIN) is ReduceOp.MIN
    with pytest.raises(ValueError):
        as_reduce_op(mpi.PROD)
    with pytest.raises(ValueError):
        as_reduce_op("product")


def test_avg_tensor_in_place_zero_d_and_integers(comm):
    n, r = comm.size, comm.rank
    scalar = torch.tensor(float(r))
    assert avg_tensor(scalar) is None
    assert scalar.shape == () and float(scalar) == pytest.approx((n - 1) / 2)
    matrix = torch.full((2, 2), 2.0 * r, dtype=torch.float64)
    avg_tensor(matrix)
    assert torch.allclose(matrix, torch.full((2, 2), float(n - 1), dtype=torch.float64))
    with pytest.raises(TypeError):
        avg_tensor(torch.ones(2, dtype=torch.int64))
    param = torch.nn.Parameter(torch.tensor([float(r)]))
    avg_tensor(param)
    assert float(param.detach()) == pytest.approx((n - 1) / 2)


def test_subgroup_average_divides_by_subgroup_size(comm, half):
    members = my_half(comm.rank, comm.size)
    got = float(dist_avg(comm.rank, half))
    assert got == pytest.approx(sum(members) / len(members))
    x = torch.tensor([float(comm.rank)])
    avg_tensor(x, half)
    assert float(x) == pytest.approx(sum(members) / len(members))


@pytest.mark.parametrize("with_min_and_max", [False, True])
def test_statistics_uneven_and_empty_ranks(comm, with_min_and_max):
    n = comm.size
    pooled = np.concatenate([samples_of(r) for r in range(n)])
    stats = statistics_scalar(samples_of(comm.rank), with_min_and_max)
    if pooled.size == 0:  # a world of one whose only rank holds nothing
        assert math.isnan(stats[0]) and math.isnan(stats[1])
        if with_min_and_max:
            assert stats[2:] == (math.inf, -math.inf)
        return
    assert stats[0] == pytest.approx(pooled.mean())
    assert stats[1] == pytest.approx(pooled.std(ddof=0))
    if with_min_and_max:
        assert stats[2:] == (pooled.min(), pooled.max())


def test_statistics_flatten_multidim_and_zero_d(comm):
    n, r = comm.size, comm.rank
    local = torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r
    pooled = np.concatenate([np.arange(6) + 10 * k for k in range(n)]).astype(np.float64)
    mean, std, lo, hi = statistics_scalar(local, True)
    assert (mean, std) == (pytest.approx(pooled.mean()), pytest.approx(pooled.std()))
    assert (lo, hi) == (0.0, 6 * 0 + 5 + 10 * (n - 1))
    assert local.shape == (2, 3) and float(local[0, 0]) == 10 * r  # untouched
    mean, std = statistics_scalar(torch.tensor(float(r)))
    assert mean == pytest.approx((n - 1) / 2)
    assert std == pytest.approx(np.arange(n).std())


def test_statistics_identical_on_every_rank(comm):
    mean, std = statistics_scalar(samples_of(comm.rank) * 1e-3 + 1e6)
    seen = comm.all_gather(np.array([mean, std]))
    assert all(np.array_equal(s, seen[0], equal_nan=True) for s in seen)


def test_all_gather_and_broadcast(comm):
    n, r = comm.size, comm.rank
    parts = all_gather(torch.tensor([r, r * r]))
    assert [p.tolist() for p in parts] == [[k, k * k] for k in range(n)]
    x = torch.tensor([float(r), -1.0])
    assert broadcast(x, src=n - 1) is x
    assert x.tolist() == [n - 1.0, -1.0]
    arr = np.full(3, r, dtype=np.int32)
    broadcast(arr, src=0)
    assert arr.tolist() == [0, 0, 0]
    barrier(timeout=30)


@pytest.mark.parametrize("dst_from_end", [False, True])
def test_gather_distributed_data_uneven_rows(comm, dst_from_end):
    n, r = comm.size, comm.rank
    dst = n - 1 if dst_from_end else 0

    def rows(k):
        return torch.full((k, 3), float(k)) + torch.arange(3.0)

    got = gather_distributed_data(rows(r), dst=dst)
    if r != dst:
        assert got is None
        return
    expected = torch.cat([rows(k) for k in range(n)])
    assert got.shape == (n * (n - 1) // 2, 3)
    assert torch.equal(got, expected)


def test_gather_distributed_data_scalars_and_empty(comm):
    n, r = comm.size, comm.rank
    got = gather_distributed_data(torch.tensor(float(r)))
    if r == 0:
        assert got.tolist() == [float(k) for k in range(n)]
    empty = gather_distributed_data(torch.zeros((0, 2)))
    if r == 0:
        assert empty.shape == (0, 2)
    else:
        assert empty is None


def test_gather_distributed_data_mismatch_raises_everywhere(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    width = 3 if comm.rank == 0 else 4
    with pytest.raises(ValueError, match="trailing shape"):
        gather_distributed_data(torch.zeros((2, width)))


def test_rank_seeds_distinct_and_deterministic(comm):
    n, r = comm.size, comm.rank
    mine = rank_seed(1234, r)
    everyone = [int(s) for s in comm.all_gather(torch.tensor([mine], dtype=torch.int64))]
    assert everyone == rank_seeds(1234, n)
    assert len(set(rank_seeds(1234, 64))) == 64
    assert rank_seed(1234, r) != rank_seed(1235, r)
    assert seed_rank(1234) == mine
    first = torch.rand(3)
    seed_rank(1234)
    assert torch.equal(torch.rand(3), first)
