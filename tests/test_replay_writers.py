"""Writers: every offered item accounted for; round robin, keep-highest top-k, dedup."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gflowdist.replay import DedupWriter, KeepHighestWriter, RoundRobinWriter, TensorStorage, row_hash
from gflowdist.replay.writers import WriteResult


def items(ids: list[int], keys: list[list[int]] | None = None) -> dict[str, torch.Tensor]:
    ids_t = torch.tensor(ids, dtype=torch.int64)
    batch = {"id": ids_t, "payload": ids_t.view(-1, 1).expand(-1, 3).float()}
    if keys is not None:
        batch["key"] = torch.tensor(keys, dtype=torch.int64).view(len(ids), -1)
    return batch


def check_accounting(storage: TensorStorage, before: int, offered: int, result: WriteResult) -> None:
    admitted = int(result.admitted.sum())
    assert admitted + sum(result.rejected.values()) == offered
    assert len(storage) == before + admitted - result.evicted
    assert len(storage) <= storage.capacity
    stored = result.indices[result.indices >= 0]
    assert bool(result.admitted[result.indices >= 0].all())
    assert stored.unique().numel() == stored.numel()
    assert bool(storage.live[stored].all())


def stored_ids(storage: TensorStorage) -> list[int]:
    return sorted(storage.get(storage.live_indices())["id"].tolist())


def test_round_robin_overwrites_oldest_and_counts_evictions():
    storage, writer = TensorStorage(4), RoundRobinWriter()
    result = writer.extend(storage, items([0, 1, 2]), None)
    assert result.indices.tolist() == [0, 1, 2] and result.evicted == 0
    result = writer.extend(storage, items([3, 4, 5]), None)
    assert result.indices.tolist() == [3, 0, 1] and result.evicted == 2
    assert stored_ids(storage) == [2, 3, 4, 5]


def test_round_robin_batch_larger_than_capacity_keeps_the_last_items():
    storage, writer = TensorStorage(3), RoundRobinWriter()
    writer.extend(storage, items([0]), None)
    result = writer.extend(storage, items([1, 2, 3, 4, 5]), None)
    check_accounting(storage, 1, 5, result)
    assert result.indices.tolist() == [-1, -1, 0, 1, 2]  # cursor 1: slots 1,2,0,1,2
    assert result.evicted == 2 + 1  # two overwritten in the call, item 0 overwritten
    assert stored_ids(storage) == [3, 4, 5]


def test_round_robin_does_not_count_freed_slots_as_evictions():
    storage, writer = TensorStorage(2), RoundRobinWriter()
    writer.extend(storage, items([0, 1]), None)
    storage.free(torch.tensor([0]))
    result = writer.extend(storage, items([2]), None)
    assert result.indices.tolist() == [0] and result.evicted == 0


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 8), batches=st.lists(st.integers(1, 12), min_size=1, max_size=8), seed=st.integers(0, 2**16)
)
def test_keep_highest_keeps_exactly_the_top_k(capacity, batches, seed):
    generator = torch.Generator().manual_seed(seed)
    total = sum(batches)
    scores_all = torch.randperm(total, generator=generator).double()  # distinct scores
    storage, writer = TensorStorage(capacity), KeepHighestWriter()
    start = 0
    for size in batches:
        ids = list(range(start, start + size))
        before = len(storage)
        result = writer.extend(storage, items(ids), scores_all[start : start + size])
        check_accounting(storage, before, size, result)
        start += size
        top = torch.topk(scores_all[:start], min(capacity, start)).indices
        assert stored_ids(storage) == sorted(top.tolist())


def test_keep_highest_rejects_items_at_or_below_the_minimum():
    storage, writer = TensorStorage(2), KeepHighestWriter()
    writer.extend(storage, items([0, 1]), torch.tensor([1.0, 5.0]))
    result = writer.extend(storage, items([2, 3, 4]), torch.tensor([1.0, 0.5, 3.0]))
    assert result.admitted.tolist() == [False, False, True]
    assert result.rejected == {"low_score": 2} and result.evicted == 1
    assert stored_ids(storage) == [1, 4]


def test_keep_highest_needs_finite_ordered_scores():
    storage, writer = TensorStorage(2), KeepHighestWriter()
    with pytest.raises(ValueError, match="needs a score per item"):
        writer.extend(storage, items([0]), None)
    with pytest.raises(ValueError, match="NaN"):
        writer.extend(storage, items([0]), torch.tensor([float("nan")]))


def test_keep_highest_fills_freed_slots_first():
    storage, writer = TensorStorage(3), KeepHighestWriter()
    writer.extend(storage, items([0, 1, 2]), torch.tensor([3.0, 2.0, 1.0]))
    storage.free(torch.tensor([0]))
    result = writer.extend(storage, items([3]), torch.tensor([0.0]))
    assert result.indices.tolist() == [0] and result.evicted == 0


@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 10),
    batches=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=10), min_size=1, max_size=8),
    keep_highest=st.booleans(),
)
def test_dedup_never_stores_two_items_with_the_same_key(capacity, batches, keep_highest):
    storage = TensorStorage(capacity)
    writer = DedupWriter("key", KeepHighestWriter() if keep_highest else RoundRobinWriter())
    next_id = 0
    for keys in batches:
        ids = list(range(next_id, next_id + len(keys)))
        next_id += len(keys)
        live_keys = set(storage.get(storage.live_indices())["key"].flatten().tolist()) if len(storage) else set()
        before = len(storage)
        scores = torch.tensor(ids, dtype=torch.float64)
        result = writer.extend(storage, items(ids, [[k] for k in keys]), scores)
        check_accounting(storage, before, len(keys), result)
        stored = storage.get(storage.live_indices())["key"].flatten().tolist()
        assert len(stored) == len(set(stored))
        # an item is a duplicate iff its key was stored before or appeared earlier in the batch
        seen, expected_dups = set(live_keys), 0
        for key in keys:
            expected_dups += key in seen
            seen.add(key)
        assert result.rejected.get("duplicate", 0) == expected_dups


def test_dedup_with_a_key_function_and_multiword_keys():
    storage = TensorStorage(8)
    writer = DedupWriter(lambda batch: batch["key"][:, :2])
    batch = items([0, 1, 2, 3], [[1, 2, 9], [1, 2, 8], [2, 1, 7], [1, 3, 6]])
    result = writer.extend(storage, batch, None)
    assert result.admitted.tolist() == [True, False, True, True]
    assert result.rejected == {"duplicate": 1}
    again = writer.extend(storage, items([4, 5], [[2, 1, 0], [5, 5, 5]]), None)
    assert again.admitted.tolist() == [False, True]


def test_dedup_key_must_exist():
    with pytest.raises(ValueError, match="'terminal' is not in the batch"):
        DedupWriter("terminal").extend(TensorStorage(2), items([0]), None)


def test_dedup_admits_a_key_again_once_its_item_left():
    storage, writer = TensorStorage(2), DedupWriter("key")
    writer.extend(storage, items([0], [[7]]), None)
    storage.free(torch.tensor([0]))
    assert writer.extend(storage, items([1], [[7]]), None).admitted.tolist() == [True]


def _splitmix_reference(x: int) -> int:
    mask = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def test_row_hash_matches_a_pure_python_reference():
    rows = [[0, -1], [2**62, 5], [-(2**63), 2**63 - 1]]
    mask = (1 << 64) - 1
    expected = []
    for row in rows:
        total = 0
        for j, value in enumerate(row):
            total = (total + _splitmix_reference(((value & mask) + j * 0x9E3779B97F4A7C15) & mask)) & mask
        expected.append(np.uint64(_splitmix_reference(total)).view(np.int64).item())
    assert row_hash(torch.tensor(rows)).tolist() == expected


def test_row_hash_has_no_collisions_on_single_word_keys():
    keys = torch.arange(-50_000, 50_000)
    assert row_hash(keys).unique().numel() == keys.numel()


def test_row_hash_distinguishes_column_order_and_handles_floats():
    assert row_hash(torch.tensor([[1, 2]]))[0] != row_hash(torch.tensor([[2, 1]]))[0]
    floats = row_hash(torch.tensor([[0.5], [0.25], [0.5]]))
    assert floats[0] == floats[2] != floats[1]


@pytest.mark.parametrize("make", [RoundRobinWriter, KeepHighestWriter, lambda: DedupWriter("key")])
def test_writer_state_round_trip_continues_identically(make):
    def run(writer, storage, ids):
        return writer.extend(storage, items(ids, [[i % 3] for i in ids]), torch.tensor(ids, dtype=torch.float64))

    storage, writer = TensorStorage(4), make()
    run(writer, storage, [0, 1, 2, 3, 4])
    restored_storage, restored = TensorStorage(4), make()
    restored_storage.load_state_dict(storage.state_dict())
    restored.load_state_dict(writer.state_dict())
    a, b = run(writer, storage, [5, 6, 7]), run(restored, restored_storage, [5, 6, 7])
    assert torch.equal(a.indices, b.indices) and a.evicted == b.evicted
    assert stored_ids(storage) == stored_ids(restored_storage)


def test_dedup_stays_exact_across_index_merges_and_frees():
    # 40 batches of 64 keys overflow the index tail (1024 entries) several times
    rng = torch.Generator().manual_seed(4)
    storage, writer = TensorStorage(300), DedupWriter("key")
    next_id = 0
    for step in range(40):
        keys = torch.randint(0, 600, (64,), generator=rng).tolist()
        live_keys = set(storage.get(storage.live_indices())["key"].flatten().tolist()) if len(storage) else set()
        ids = list(range(next_id, next_id + 64))
        next_id += 64
        result = writer.extend(storage, items(ids, [[k] for k in keys]), None)
        seen, expected = set(live_keys), []
        for key in keys:
            expected.append(key not in seen)
            seen.add(key)
        assert result.admitted.tolist() == expected
        if step % 5 == 4:  # a consumer frees some slots behind the writer's back
            storage.free(storage.live_indices()[::3])
