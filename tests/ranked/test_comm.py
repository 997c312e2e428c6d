"""The communicator contract, at every world size and on every engine.

Bound to the ``comm`` fixture (world of one, MPI or gloo); cross-rank facts
are checked on every rank.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from gflowdist.comm import ReduceOp
from gflowdist.errors import DeadlineError


def halves(size):
    """Two groups (lower / upper half) or one group in a world of one."""
    if size == 1:
        return [[0]]
    cut = size // 2
    return [list(range(cut)), list(range(cut, size))]


@pytest.fixture(scope="module")
def halves_comm(comm):
    sub = comm.split(halves(comm.size))
    yield sub
    sub.free()


def test_identity(comm):
    assert 0 <= comm.rank < comm.size
    ranks = comm.all_gather(torch.tensor([comm.rank]))
    assert [int(r) for r in ranks] == list(range(comm.size))
    assert isinstance(comm.host, str) and comm.host


@pytest.mark.parametrize("kind", ["tensor", "array"])
def test_all_reduce_ops(comm, kind):
    n, r = comm.size, comm.rank
    make = (
        (lambda v: torch.tensor(v, dtype=torch.float64))
        if kind == "tensor"
        else (lambda v: np.array(v, dtype=np.float64))
    )
    x = make([r + 1.0, -r])
    out = comm.all_reduce(x, ReduceOp.SUM)
    assert out is x
    assert list(np.asarray(x)) == [n * (n + 1) / 2, -n * (n - 1) / 2]
    assert list(np.asarray(comm.all_reduce(make([r, 2.0 * r]), ReduceOp.MAX))) == [n - 1, 2 * (n - 1)]
    assert list(np.asarray(comm.all_reduce(make([r, 2.0 * r]), ReduceOp.MIN))) == [0, 0]
    avg = comm.all_reduce(make([float(r)]), ReduceOp.AVG)
    assert np.asarray(avg)[0] == pytest.approx((n - 1) / 2)


def test_all_reduce_not_in_place_and_dtypes(comm):
    n = comm.size
    x = torch.full((3,), comm.rank + 1, dtype=torch.int32)
    y = comm.all_reduce(x, ReduceOp.SUM, inplace=False)
    assert y is not x and int(x[0]) == comm.rank + 1
    assert y.dtype == torch.int32 and y.tolist() == [n * (n + 1) // 2] * 3
    with pytest.raises(TypeError):
        comm.all_reduce(torch.ones(2, dtype=torch.int64), ReduceOp.AVG)
    b = torch.full((4,), 0.5, dtype=torch.bfloat16)
    comm.all_reduce(b, ReduceOp.SUM)
    assert b.dtype == torch.bfloat16 and b.float().tolist() == [0.5 * n] * 4
    scalar = torch.tensor(float(comm.rank))
    comm.all_reduce(scalar, ReduceOp.MAX)
    assert scalar.shape == () and float(scalar) == n - 1


def test_all_reduce_non_contiguous(comm):
    base = torch.zeros(4, 6)
    view = base[:, ::2]
    view.fill_(comm.rank + 1.0)
    comm.all_reduce(view, ReduceOp.SUM)
    total = comm.size * (comm.size + 1) / 2
    assert torch.all(base[:, ::2] == total) and torch.all(base[:, 1::2] == 0)


def test_avg_divides_by_subgroup_size(comm, halves_comm):
    sub = halves_comm
    groups = halves(comm.size)
    mine = next(g for g in groups if comm.rank in g)
    assert sub.size == len(mine) and sub.rank == mine.index(comm.rank)
    x = torch.tensor([float(comm.rank)])
    sub.all_reduce(x, ReduceOp.AVG)
    assert float(x) == pytest.approx(sum(mine) / len(mine))
    assert sub.world_rank(sub.rank) == comm.rank


def test_broadcast_src_is_group_rank(comm, halves_comm):
    sub = halves_comm
    mine = next(g for g in halves(comm.size) if comm.rank in g)
    src = sub.size - 1  # the last member of my group, in group numbering
    x = torch.tensor([comm.rank, comm.rank * 10])
    sub.broadcast(x, src=src)
    assert x.tolist() == [mine[src], mine[src] * 10]
    a = np.array([float(comm.rank)])
    comm.broadcast(a, src=comm.size - 1)
    assert a[0] == comm.size - 1


def test_all_gather_and_gather(comm):
    x = torch.arange(3) + 10 * comm.rank
    gathered = comm.all_gather(x)
    assert [g.tolist() for g in gathered] == [[10 * r, 10 * r + 1, 10 * r + 2] for r in range(comm.size)]
    arrays = comm.all_gather(np.full((2, 2), comm.rank, dtype=np.float32))
    assert [float(a[0, 0]) for a in arrays] == list(range(comm.size))
    dst = comm.size - 1
    got = comm.gather(torch.tensor([comm.rank * 2.0]), dst=dst)
    if comm.rank == dst:
        assert [float(g) for g in got] == [2.0 * r for r in range(comm.size)]
    else:
        assert got is None


def test_all_gather_bytes_uneven(comm):
    data = bytes([comm.rank]) * comm.rank  # rank 0 sends nothing
    assert comm.all_gather_bytes(data) == [bytes([r]) * r for r in range(comm.size)]


def test_split_non_members_get_none(comm):
    sub = comm.split([[0]])
    if comm.rank == 0:
        assert sub is not None and sub.size == 1
        sub.free()
    else:
        assert sub is None


def test_barrier(comm):
    comm.barrier(timeout=30)


def peers(comm):
    """My next and previous rank on a ring (myself in a world of one)."""
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def test_send_recv_ring_both_directions(comm):
    nxt, prv = peers(comm)
    comm.isend(f"from {comm.rank}".encode(), nxt, tag=1)
    src, payload = comm.recv(prv, tag=1, timeout=30)
    assert src == prv and bytes(payload.numpy()) == f"from {prv}".encode()
    assert payload.dtype == torch.uint8
    handle = comm.isend(torch.tensor([comm.rank], dtype=torch.int64), prv, tag=2)
    src, payload = comm.recv(nxt, tag=2, timeout=30)
    handle.wait(timeout=30)
    assert handle.is_complete()
    assert src == nxt and payload.view(torch.int64).item() == nxt
    comm.barrier()


def test_any_source_and_zero_bytes(comm):
    if comm.rank != 0:
        comm.send(b"", 0, tag=3, timeout=30)
        comm.send(np.array([comm.rank], dtype=np.int32), 0, tag=3, timeout=30)
    else:
        seen = {}
        for _ in range(2 * (comm.size - 1)):
            src, payload = comm.recv(tag=3, timeout=30)
            seen.setdefault(src, []).append(payload.numel())
        assert seen == {r: [0, 4] for r in range(1, comm.size)}
    comm.barrier()


def test_many_interleaved_messages_keep_order(comm):
    """Every rank sends 200 numbered messages of mixed sizes to every other rank, on two tags."""
    count = 200
    handles = []
    for dst in range(comm.size):
        if dst == comm.rank and comm.size > 1:
            continue
        for i in range(count):
            size = 4 + (i * 7919) % 3000
            body = np.full(size, i % 251, dtype=np.uint8)
            body[:4] = np.frombuffer(np.int32(i).tobytes(), dtype=np.uint8)
            handles.append(comm.isend(body, dst, tag=4 + i % 2))
    expected_from = [r for r in range(comm.size) if r != comm.rank] or [comm.rank]
    next_index = {(src, tag): tag - 4 for src in expected_from for tag in (4, 5)}
    for _ in range(count * len(expected_from)):
        tag = 4 + (_ % 2)
        src, payload = comm.recv(None, tag=tag, timeout=60)
        i = int(payload[:4].numpy().view(np.int32)[0])
        assert i == next_index[(src, tag)], f"message {i} from {src} out of order"
        assert payload.numel() == 4 + (i * 7919) % 3000
        next_index[(src, tag)] += 2
    for handle in handles:
        handle.wait(timeout=60)
    comm.barrier()


def test_chunked_messages(comm):
    old = comm.chunk_bytes
    comm.chunk_bytes = 1000  # simulate the 2 GiB limit with a small one
    try:
        nxt, prv = peers(comm)
        sizes = [999, 1000, 1001, 4567, 0]
        handles = [comm.isend(np.arange(n, dtype=np.int64).view(np.uint8)[:n], nxt, tag=6) for n in sizes]
        for n in sizes:
            src, payload = comm.recv(prv, tag=6, timeout=30)
            assert src == prv and payload.numel() == n
            assert np.array_equal(payload.numpy(), np.arange(n, dtype=np.int64).view(np.uint8)[:n])
        for h in handles:
            h.wait(timeout=30)
    finally:
        comm.chunk_bytes = old
    comm.barrier()


def test_recv_timeout_raises_and_loses_nothing(comm):
    t0 = time.monotonic()
    with pytest.raises(DeadlineError):
        comm.recv(None, tag=7, timeout=0.2)
    assert time.monotonic() - t0 >= 0.2
    comm.barrier()
    nxt, prv = peers(comm)
    comm.send(b"late", nxt, tag=7, timeout=30)
    assert bytes(comm.recv(prv, tag=7, timeout=30)[1].numpy()) == b"late"
    comm.barrier()


def test_idle_recv_does_not_spin(comm):
    """A rank blocked in recv for 3 s uses well under 10% of a core."""
    if comm.rank == 0:
        cpu0, wall0 = time.process_time(), time.monotonic()
        with pytest.raises(DeadlineError):
            comm.recv(None, tag=8, timeout=3.0)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        assert cpu / wall < 0.10, f"recv used {cpu / wall:.0%} of a core while idle"
    comm.barrier(timeout=60)


def test_collectives_with_a_wait_hook(comm):
    """With a keep-alive hook collectives take the nonblocking path: same answers, hook called on long waits."""
    calls = []
    comm.wait_hook = lambda: calls.append(1)
    try:
        n, r = comm.size, comm.rank
        x = torch.tensor([float(r), 1.0])
        comm.all_reduce(x, ReduceOp.AVG)
        assert x.tolist() == [pytest.approx((n - 1) / 2), 1.0]
        y = np.array([r], dtype=np.int64)
        comm.all_reduce(y, ReduceOp.SUM)
        assert int(y[0]) == n * (n - 1) // 2
        b = torch.tensor([r])
        comm.broadcast(b, src=n - 1)
        assert int(b) == n - 1
        assert [int(t) for t in comm.all_gather(torch.tensor([r]))] == list(range(n))
        if r == 0:
            time.sleep(0.2)  # the others wait past the spin phase: their hook runs
        comm.barrier(timeout=30)
        waited = comm.all_gather(torch.tensor([len(calls)]))
        if n > 1:
            assert any(int(c) > 0 for c in waited[1:])
    finally:
        comm.wait_hook = None
    comm.barrier()


def test_free_ends_every_engine_thread(comm):
    """free() is collective and joins the engine's helper threads (a torch communicator has two).

    A receiver or send-completion thread left running aborts the process at
    interpreter exit ("terminate called without an active exception").
    """
    import threading

    before = {t.ident for t in threading.enumerate()}
    sub = comm.split([list(range(comm.size))])
    nxt, prv = peers(sub)
    sub.isend(f"last words of {sub.rank}".encode(), nxt, tag=7)
    src, payload = sub.recv(prv, tag=7, timeout=30)
    assert src == prv and bytes(payload.numpy()) == f"last words of {prv}".encode()
    sub.free()
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []
    comm.barrier(timeout=30)
