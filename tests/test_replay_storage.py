"""TensorStorage: lazy allocation, schema checks, copies out, free, checkpoint."""

from __future__ import annotations

import pytest
import torch

from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.replay import ItemSchemaError, TensorStorage


def items(size: int, start: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.arange(start, start + size)
    return {"states": ids.view(-1, 1, 1).expand(size, 3, 2).clone(), "log_reward": ids.float()}


def test_allocates_at_first_set_from_the_batch_schema():
    storage = TensorStorage(5)
    assert storage.schema == {} and len(storage) == 0
    storage.set(torch.tensor([0, 1]), items(2))
    assert storage.schema == {"states": ((3, 2), torch.int64), "log_reward": ((), torch.float32)}
    assert storage.fields["states"].shape == (5, 3, 2)
    assert len(storage) == 2


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"states": torch.zeros(2, 3, 2, dtype=torch.int64)}, "missing ['log_reward']"),
        ({**items(2), "extra": torch.zeros(2)}, "unexpected ['extra']"),
        ({**items(2), "states": torch.zeros(2, 4, 2, dtype=torch.int64)}, "per-item shape [4, 2]"),
        ({**items(2), "states": torch.zeros(2, 3, 2, dtype=torch.int32)}, "torch.int32"),
        ({**items(2), "log_reward": torch.zeros(3)}, "disagree on the batch size"),
        ({**items(2), "log_reward": [0.0, 1.0]}, "must be a torch.Tensor"),
    ],
)
def test_a_batch_that_differs_from_the_schema_is_refused_before_writing(bad, words):
    storage = TensorStorage(4)
    storage.set(torch.tensor([0, 1]), items(2))
    before = {name: t.clone() for name, t in storage.fields.items()}
    with pytest.raises(ItemSchemaError, match=words.replace("[", r"\[").replace("]", r"\]")):
        storage.set(torch.tensor([2, 3]), bad)
    assert all(torch.equal(before[name], storage.fields[name]) for name in before)
    assert len(storage) == 2


def test_schema_error_is_a_gflowdist_value_error():
    assert issubclass(ItemSchemaError, GflowdistError)
    assert issubclass(ItemSchemaError, ValueError)


def test_get_copies_out_and_allows_repeats():
    storage = TensorStorage(3)
    storage.set(torch.tensor([2, 0]), items(2, start=10))
    out = storage.get(torch.tensor([0, 0, 2]))
    assert out["log_reward"].tolist() == [11.0, 11.0, 10.0]
    out["log_reward"][:] = -1
    assert storage.get(torch.tensor([0]))["log_reward"].item() == 11.0


def test_get_refuses_free_slots_and_out_of_range_indices():
    storage = TensorStorage(3)
    storage.set(torch.tensor([0]), items(1))
    with pytest.raises(IndexError, match="hold no item"):
        storage.get(torch.tensor([1]))
    with pytest.raises(IndexError, match="out of range"):
        storage.get(torch.tensor([3]))
    with pytest.raises(IndexError, match="distinct"):
        storage.set(torch.tensor([1, 1]), items(2))


def test_free_counts_only_live_slots_once():
    storage = TensorStorage(4)
    storage.set(torch.tensor([0, 1, 2]), items(3))
    assert storage.free(torch.tensor([1, 1, 3])) == 1
    assert len(storage) == 2
    assert storage.live_indices().tolist() == [0, 2]
    storage.set(torch.tensor([1]), items(1))
    assert len(storage) == 3


def test_capacity_must_be_positive():
    with pytest.raises(ConfigError, match=r"replay.capacity"):
        TensorStorage(0)


def test_state_dict_round_trip_keeps_live_rows_only():
    storage = TensorStorage(6)
    storage.set(torch.tensor([0, 1, 2, 3]), items(4))
    storage.free(torch.tensor([1]))
    state = storage.state_dict()
    assert state["slots"].tolist() == [0, 2, 3]
    assert state["fields"]["states"].shape == (3, 3, 2)
    restored = TensorStorage(6)
    restored.load_state_dict(state)
    assert torch.equal(restored.live, storage.live)
    slots = storage.live_indices()
    for name, value in storage.get(slots).items():
        assert torch.equal(restored.get(slots)[name], value)
    with pytest.raises(ConfigError, match="capacity 6"):
        TensorStorage(5).load_state_dict(state)


def test_empty_storage_state_round_trip():
    restored = TensorStorage(2)
    restored.load_state_dict(TensorStorage(2).state_dict())
    assert len(restored) == 0 and restored.schema == {}
