"""Byte framing on every engine: message kinds, each framing mode's size boundaries, kept payloads, bad headers.

Bound to the ``comm`` fixture (world of one, MPI or gloo); every rank sends to
the next rank of a ring and receives from the previous one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import gflowdist.compat.torchgfn as tg
from gflowdist.comm.torch_p2p import DIRECT_BYTES, HAND_OVER_BYTES, INLINE_BYTES, LEAD_BYTES, LEAD_PIECES
from gflowdist.errors import ProtocolError


def ring(comm):
    return (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size


def numbered(n: int, seed: int) -> np.ndarray:
    """``n`` bytes that differ between seeds (a payload overwritten by a later one would show): byte ``i`` is
    ``(31 i + 7 seed) mod 251``, a pattern of period 251 repeated (cheap at 16 MiB)."""
    return np.resize(((np.arange(251, dtype=np.int64) * 31 + seed * 7) % 251).astype(np.uint8), n)


def test_kinds_travel_with_messages_in_order(comm):
    nxt, prv = ring(comm)
    kinds = [0, 1, 1, 0, 1]
    handles = [comm.isend(numbered(5 + i, i), nxt, tag=11, kind=k) for i, k in enumerate(kinds)]
    comm.send(numbered(3, 9), nxt, tag=11, kind=1)
    for i, kind in enumerate(kinds):
        src, payload, got = comm.recv_kind(prv, tag=11, timeout=30)
        assert (src, got) == (prv, kind) and np.array_equal(payload.numpy(), numbered(5 + i, i))
    assert bytes(comm.recv(prv, tag=11, timeout=30)[1].numpy()) == numbered(3, 9).tobytes()  # plain recv too
    for handle in handles:
        handle.wait(timeout=30)
    with pytest.raises(ValueError, match="kind"):
        comm.isend(b"x", nxt, tag=11, kind=2)
    comm.barrier()


# sizes at each framing boundary of the torch engine (inline, copied out of its frame or handed over in it;
# lead pieces and pieces received in place, one or several); one MPI message each
SIZES = [
    0,
    1,
    HAND_OVER_BYTES - 1,
    HAND_OVER_BYTES,
    INLINE_BYTES,
    INLINE_BYTES + 1,
    LEAD_PIECES * LEAD_BYTES + DIRECT_BYTES + 1,  # two pieces in place
]


def test_every_framing_mode_and_boundary_arrives_whole(comm):
    nxt, prv = ring(comm)
    handles = [comm.isend(numbered(n, i), nxt, tag=12, kind=i % 2) for i, n in enumerate(SIZES)]
    kept = [comm.recv_kind(prv, tag=12, timeout=60) for _ in SIZES]
    for handle in handles:
        handle.wait(timeout=60)
    # every payload is still intact after all of them arrived (no receive buffer was reused under it)
    for i, (n, (src, payload, kind)) in enumerate(zip(SIZES, kept, strict=False)):
        assert (src, kind, payload.numel(), payload.dtype) == (prv, i % 2, n, torch.uint8)
        assert np.array_equal(payload.numpy(), numbered(n, i)), f"message {i} ({n} bytes) corrupted"
    comm.barrier()


@pytest.mark.parametrize("n", [INLINE_BYTES, 2 * INLINE_BYTES], ids=["inline", "pieces"])
def test_held_payloads_survive_later_messages_of_the_same_size(comm, n):
    """Six messages back to back, all kept: recycled receive buffers (on gloo, the frames an inline payload of
    1 MiB is handed over in, and the buffers pieces land in) never overwrite one in use."""
    nxt, prv = ring(comm)
    handles = [comm.isend(numbered(n, i), nxt, tag=13) for i in range(6)]
    received = [comm.recv(prv, tag=13, timeout=60)[1] for _ in range(6)]
    kept = [received[i] for i in (0, 2, 4, 5)]
    del received  # messages 1 and 3 are dropped: their buffers may serve again
    handles += [comm.isend(numbered(n, seed), nxt, tag=13) for seed in (10, 11)]
    more = [comm.recv(prv, tag=13, timeout=60)[1] for _ in range(2)]
    for handle in handles:
        handle.wait(timeout=60)
    for payload, seed in zip(kept + more, [0, 2, 4, 5, 10, 11], strict=False):
        assert np.array_equal(payload.numpy(), numbered(n, seed))
    comm.barrier()


def test_messages_a_receive_waited_for_are_each_their_own_tensor(comm):
    """A token passed round the ring 8 times, 24 bytes each time: every receive waits for its message (MPI makes
    the next message's tensor while it waits, of the size last received). Each message kept is its own."""
    nxt, prv = ring(comm)
    kept = []
    for lap in range(8):
        if comm.rank == 0:
            comm.send(numbered(24, lap * comm.size), nxt, tag=14)
            kept.append(comm.recv(prv, tag=14, timeout=60)[1])
        else:
            kept.append(comm.recv(prv, tag=14, timeout=60)[1])
            comm.send(numbered(24, lap * comm.size + comm.rank), nxt, tag=14)
    for lap, payload in enumerate(kept):
        assert np.array_equal(payload.numpy(), numbered(24, lap * comm.size + prv)), lap
    assert len({payload.data_ptr() for payload in kept}) == len(kept)
    comm.barrier()


def test_compat_sends_byte_tensors_as_they_are(comm):
    """A flat uint8 tensor crosses as its own bytes (kind 1); other values as a wire message (kind 0)."""
    backend = "torch" if comm.engine == "torch" else "mpi"
    world = tg.world_for(backend)
    nxt, prv = ring(world)
    strided = torch.arange(40, dtype=torch.uint8)[::2]
    tg.isend(strided, nxt, backend=backend, tag=14).wait(timeout=30)
    src, wire, kind = world.recv_kind(prv, 14, timeout=30)
    assert (src, kind) == (prv, 1) and torch.equal(wire, strided)
    tg.isend(strided.reshape(4, 5), nxt, backend=backend, tag=14).wait(timeout=30)
    src, wire, kind = world.recv_kind(prv, 14, timeout=30)
    assert kind == 0 and bytes(wire[:2].numpy()) == b"GF"
    for value in (strided, strided.reshape(4, 5), torch.empty(0, dtype=torch.uint8)):
        tg.send(value, nxt, backend=backend, tag=15)
        src, got = tg.recv(prv, backend=backend, tag=15, timeout=30)
        assert src == prv and got.dtype == torch.uint8 and torch.equal(got, value)
    world.barrier()


def test_a_malformed_gloo_header_is_refused_naming_the_sender(comm):
    if comm.engine != "torch" or comm.size == 1:
        pytest.skip("the gloo header only exists between torch.distributed ranks")
    from gflowdist.comm.torch_p2p import _HEADER, HEADER_TAG

    nxt, prv = ring(comm)
    bad = torch.from_numpy(np.frombuffer(_HEADER.pack(16, 0, 7, 10, 0), dtype=np.uint8).copy())  # mode 7
    comm._pg.send([bad], comm._p2p_ranks[nxt], HEADER_TAG).wait()
    comm.send(b"after", nxt, tag=16)
    with pytest.raises(ProtocolError) as info:
        comm.recv(prv, tag=16, timeout=30)
    assert info.value.sender == prv
    assert bytes(comm.recv(prv, tag=16, timeout=30)[1].numpy()) == b"after"  # the stream goes on
    comm.barrier()


def test_pieces_of_a_small_chunk_size_arrive_whole(comm):
    """A communicator's own smaller ``chunk_bytes``: on gloo a message past the inline size goes in lead pieces
    and then pieces of that size, received in place (an inline one ignores it)."""
    nxt, prv = ring(comm)
    old = comm.chunk_bytes
    comm.chunk_bytes = 40_000
    try:
        sizes = [INLINE_BYTES + 1, INLINE_BYTES + 200_000, 3 * 40_000]
        handles = [comm.isend(numbered(n, i), nxt, tag=17) for i, n in enumerate(sizes)]
        kept = [comm.recv(prv, tag=17, timeout=60)[1] for _ in sizes]
        for handle in handles:
            handle.wait(timeout=60)
    finally:
        comm.chunk_bytes = old
    for i, (n, payload) in enumerate(zip(sizes, kept, strict=True)):
        assert np.array_equal(payload.numpy(), numbered(n, i)), f"message {i} ({n} bytes) corrupted"
    comm.barrier()


def test_gloo_messages_over_the_receivers_limit_are_refused_and_the_stream_goes_on(comm):
    """Over ``max_recv_bytes`` an inline message and one in lead and in-place pieces are read to their end and
    refused naming the sender; the next message arrives whole."""
    if comm.engine != "torch":
        pytest.skip("this limit on messages in lead and in-place pieces is the gloo framing's")
    if comm.size == 1:
        pytest.skip("a world of one loops its messages back through the inbox: none reaches the gloo framing")
    nxt, prv = ring(comm)
    comm.max_recv_bytes = 100_000
    comm.barrier()  # every receiver has its limit before any message arrives (a lane may file one early)
    try:
        sizes = [200_000, 2 * INLINE_BYTES + 5, 1000]
        handles = [comm.isend(numbered(n, i), nxt, tag=18) for i, n in enumerate(sizes)]
        for n in sizes[:2]:
            with pytest.raises(ProtocolError, match=f"message of {n} bytes is over the limit") as info:
                comm.recv(prv, tag=18, timeout=60)
            assert info.value.sender == prv
        assert np.array_equal(comm.recv(prv, tag=18, timeout=60)[1].numpy(), numbered(1000, 2))
        for handle in handles:
            handle.wait(timeout=60)
    finally:
        comm.max_recv_bytes = None
    comm.barrier()
