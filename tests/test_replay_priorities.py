"""Prioritized replay closes its loop in the buffer: item keys, updates, stale keys, beta.

Sampling frequencies are checked against binomial bands (5 standard
deviations, Bonferroni over the items: a correct sampler fails with
probability < 1e-5 for any seed; the seed is fixed anyway).
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.errors import ConfigError
from gflowdist.replay import BetaSchedule, ReplayBuffer
from gflowdist.replay.priorities import item_keys, split_keys

EPS = 1e-6


def items(first: int, count: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.arange(first, first + count, dtype=torch.float32).view(-1, 1),
        "tag": torch.arange(first, first + count),
    }


def buffer_of(capacity: int, **kwargs) -> ReplayBuffer:
    return ReplayBuffer.prioritized(capacity, generator=torch.Generator().manual_seed(4), **kwargs)


def frequencies_match(tags: torch.Tensor, priorities: torch.Tensor, alpha: float, draws: int) -> bool:
    counts = torch.bincount(tags, minlength=priorities.numel()).double()
    scaled = (priorities.double() + EPS) ** alpha
    expected = scaled / scaled.sum()
    band = 5.0 * torch.sqrt(expected * (1 - expected) / draws)
    return bool(((counts / draws - expected).abs() <= band).all())


def test_sampling_follows_priorities_updated_through_keys():
    alpha, size, draws = 0.8, 8, 30_000
    buffer = buffer_of(size, alpha=alpha, beta=0.5)
    buffer.extend(items(0, size), producer=0, seq=0, policy_version=0)
    before, _ = buffer.sample(draws)
    uniform = torch.ones(size)
    assert frequencies_match(before["tag"], uniform, alpha, draws)
    # one update per item, through the keys a sample handed out
    _, info = buffer.sample(64)
    first = {}
    for key, slot in zip(info["keys"].tolist(), info["indices"].tolist(), strict=False):
        first.setdefault(slot, key)
    assert sorted(first) == list(range(size))  # 64 draws of 8 equal items hit each one
    priorities = torch.tensor([0.1, 0.5, 1.0, 2.0, 3.0, 0.3, 4.0, 8.0])
    keys = torch.tensor([first[slot] for slot in range(size)])
    assert buffer.update_priorities(keys, priorities) == size
    batch, _ = buffer.sample(draws)
    assert frequencies_match(batch["tag"], priorities, alpha, draws)
    assert not frequencies_match(batch["tag"], uniform, alpha, draws)  # measurably changed
    assert buffer.counters["priority_updates"] == size
    assert buffer.counters["stale_priority_updates"] == 0


def test_weights_match_the_formula_while_beta_anneals():
    alpha, size = 0.6, 5
    buffer = buffer_of(size, alpha=alpha, beta=0.4, beta_final=1.0, beta_steps=100)
    priorities = torch.tensor([0.2, 1.0, 3.0, 5.0, 0.7])
    buffer.extend(items(0, size), producer=1, seq=0, policy_version=0, priorities=priorities)
    stored = priorities.double() + EPS
    prob = stored**alpha / (stored**alpha).sum()
    for step, beta in ((0, 0.4), (50, 0.7), (100, 1.0), (1000, 1.0)):
        _, info = buffer.sample(400, step=step)
        raw = (size * prob) ** (-beta)
        expected = (raw / raw.max())[info["indices"]].float()
        assert torch.allclose(info["weights"], expected, rtol=1e-5), step
    # without a step the schedule runs on the number of sample calls (4 so far)
    _, info = buffer.sample(400)
    raw = (size * prob) ** (-(0.4 + 0.6 * 4 / 100))
    assert torch.allclose(info["weights"], (raw / raw.max())[info["indices"]].float(), rtol=1e-5)


def test_updates_for_overwritten_items_are_ignored_and_counted():
    buffer = buffer_of(4, alpha=1.0, beta=1.0)
    buffer.extend(items(0, 4), producer=0, seq=0, policy_version=0)
    _, info = buffer.sample(32)
    old = {slot: key for slot, key in zip(info["indices"].tolist(), info["keys"].tolist(), strict=False)}
    buffer.extend(items(4, 2), producer=0, seq=4, policy_version=1)  # round robin: slots 0, 1 reused
    keys = torch.tensor([old[slot] for slot in range(4)])
    applied = buffer.update_priorities(keys, torch.tensor([9.0, 9.0, 3.0, 5.0]))
    assert applied == 2
    assert buffer.counters["stale_priority_updates"] == 2
    # the new items in slots 0 and 1 keep the priority they were given on insert (max = 1)
    assert buffer.sampler.scaled[:4].tolist() == pytest.approx([1.0, 1.0, 3.0 + EPS, 5.0 + EPS])
    slots, steps = split_keys(keys, 4)
    assert slots.tolist() == [0, 1, 2, 3] and steps.tolist() == [0, 1, 2, 3]


def test_keys_stay_valid_across_a_checkpoint():
    buffer = buffer_of(6, alpha=1.0, beta=1.0)
    buffer.extend(items(0, 6), producer=0, seq=0, policy_version=0)
    _, info = buffer.sample(3)
    restored = buffer_of(6, alpha=1.0, beta=1.0)
    restored.load_state_dict(buffer.state_dict())
    assert restored.update_priorities(info["keys"], torch.full((3,), 7.0)) == 3
    assert torch.equal(info["keys"], item_keys(info["indices"], info["insert_step"], 6))


def test_initial_priorities_set_the_sampling_distribution():
    alpha, draws = 1.0, 20_000
    buffer = buffer_of(6, alpha=alpha, beta=0.4)
    priorities = torch.tensor([6.0, 1.0, 0.5, 2.0, 0.0, 3.0])
    buffer.extend(items(0, 6), producer=2, seq=0, policy_version=0, priorities=priorities)
    batch, _ = buffer.sample(draws)
    assert frequencies_match(batch["tag"], priorities, alpha, draws)
    assert buffer.sampler.max_priority == pytest.approx(6.0 + EPS)
    assert buffer.counters["initial_priorities"] == 6


@pytest.mark.parametrize(
    "priorities, error, words",
    [
        (torch.tensor([1.0, -1.0]), ValueError, "finite and >= 0"),
        (torch.tensor([1.0, float("nan")]), ValueError, "finite and >= 0"),
        (torch.tensor([1.0, 2.0, 3.0]), ValueError, "3 priorities for 2 items"),
    ],
)
def test_bad_initial_priorities_are_refused_before_anything_is_stored(priorities, error, words):
    buffer = buffer_of(4)
    with pytest.raises(error, match=words):
        buffer.extend(items(0, 2), producer=0, seq=0, policy_version=0, priorities=priorities)
    assert len(buffer) == 0 and buffer.counters["offered"] == 0


def test_a_buffer_without_priorities_refuses_them():
    buffer = ReplayBuffer.uniform(4)
    with pytest.raises(TypeError, match="need sampler 'prioritized'"):
        buffer.extend(items(0, 2), producer=0, seq=0, policy_version=0, priorities=torch.ones(2))
    assert len(buffer) == 0
    with pytest.raises(TypeError, match="uniform sampler has no priorities"):
        buffer.update_priorities(torch.tensor([0]), torch.tensor([1.0]))


def test_beta_schedule_is_linear_then_flat():
    schedule = BetaSchedule(0.4, 1.0, 10)
    assert [schedule.value(t) for t in (-3, 0, 5, 10, 99)] == pytest.approx([0.4, 0.4, 0.7, 1.0, 1.0])
    assert BetaSchedule(0.5).value(10**9) == 0.5
    with pytest.raises(ConfigError, match="nothing to anneal towards"):
        BetaSchedule(0.5, None, 3)
