"""Samplers: uniform range, prioritized frequencies and importance weights, FIFO order."""

from __future__ import annotations

import math

import pytest
import torch

from gflowdist.errors import ConfigError
from gflowdist.replay import FifoSampler, InsufficientItemsError, PrioritizedSampler, UniformSampler


def seeded(seed: int = 0) -> torch.Generator:
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def test_uniform_stays_in_range_and_covers_every_slot():
    indices, info = UniformSampler().sample(7, 2000, seeded())
    assert int(indices.min()) == 0 and int(indices.max()) == 6
    assert info == {}


@pytest.mark.parametrize("sampler", [UniformSampler(), PrioritizedSampler()])
def test_sampling_from_nothing_raises(sampler):
    with pytest.raises(InsufficientItemsError, match="empty buffer"):
        sampler.sample(0, 3, seeded())
    with pytest.raises(ValueError, match="positive int"):
        sampler.sample(3, 0, seeded())


def prioritized_with(priorities: list[float], alpha: float, beta: float) -> PrioritizedSampler:
    sampler = PrioritizedSampler(alpha=alpha, beta=beta, eps=1e-6)
    slots = torch.arange(len(priorities))
    sampler.on_write(slots)
    sampler.update_priorities(slots, torch.tensor(priorities))
    return sampler


def test_prioritized_frequencies_follow_priorities():
    # Each count c_i is Binomial(M, P_i). With Z = 5 standard deviations the
    # chance that any of the 8 counts leaves its band is below 8 * 5.7e-7
    # (Bonferroni), so a correct sampler passes for practically every seed;
    # the seed is fixed anyway.
    priorities = [0.1, 0.5, 1.0, 2.0, 3.0, 0.3, 4.0, 8.0]
    alpha, draws, z = 0.7, 40_000, 5.0
    sampler = prioritized_with(priorities, alpha, beta=0.5)
    indices, _ = sampler.sample(len(priorities), draws, seeded(1))
    counts = torch.bincount(indices, minlength=len(priorities)).double()
    stored = torch.tensor(priorities, dtype=torch.float64) + 1e-6
    expected = stored**alpha / (stored**alpha).sum()
    assert torch.allclose(sampler.probabilities(len(priorities)), expected)
    band = z * torch.sqrt(expected * (1 - expected) / draws)
    assert bool(((counts / draws - expected).abs() <= band).all()), (counts / draws, expected)


def test_importance_weights_follow_the_formula():
    priorities = [0.2, 1.0, 3.0, 5.0, 0.7]
    alpha, beta = 0.6, 0.4
    n_items = len(priorities)
    sampler = prioritized_with(priorities, alpha, beta)
    indices, info = sampler.sample(n_items, 500, seeded(2))
    stored = torch.tensor(priorities, dtype=torch.float64) + 1e-6
    prob = stored**alpha / (stored**alpha).sum()
    raw = (n_items * prob) ** (-beta)
    expected = (raw / raw.max())[indices].float()
    assert info["weights"].dtype == torch.float32
    assert torch.allclose(info["weights"], expected, rtol=1e-5)
    assert float(info["weights"].max()) <= 1.0


def test_new_items_get_the_largest_priority_seen():
    sampler = PrioritizedSampler(alpha=1.0, beta=1.0)
    sampler.on_write(torch.arange(3))
    sampler.update_priorities(torch.tensor([0, 1]), torch.tensor([5.0, 0.5]))
    sampler.on_write(torch.tensor([2]))
    assert sampler.scaled[2] == pytest.approx(5.0 + 1e-6)


def test_priority_updates_are_validated():
    sampler = PrioritizedSampler()
    sampler.on_write(torch.arange(2))
    with pytest.raises(ValueError, match="finite and >= 0"):
        sampler.update_priorities(torch.tensor([0]), torch.tensor([-1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        sampler.update_priorities(torch.tensor([0]), torch.tensor([math.nan]))
    with pytest.raises(IndexError, match="never written"):
        sampler.update_priorities(torch.tensor([2]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="2 priorities"):
        sampler.update_priorities(torch.tensor([0]), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"eps": 0.0}, "replay.eps"),
        ({"alpha": -1.0}, "replay.priority_alpha"),
        ({"beta": math.inf}, "replay.priority_beta"),
        ({"beta_final": -0.5, "beta_steps": 10}, "replay.priority_beta_final"),
        ({"beta_final": 1.0}, "replay.priority_beta_steps"),
        ({"beta_steps": 10}, "replay.priority_beta_steps"),
    ],
)
def test_prioritized_settings_are_validated(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        PrioritizedSampler(**kwargs)


def test_eps_zero_message_says_the_consequence():
    with pytest.raises(ConfigError, match="never sampled again"):
        PrioritizedSampler(eps=0.0)


def test_fifo_serves_oldest_first_and_each_item_once():
    sampler = FifoSampler()
    sampler.on_write(torch.tensor([3, 1, 4]))
    sampler.on_write(torch.tensor([0, 2]))
    first, _ = sampler.sample(5, 2, seeded())
    assert first.tolist() == [3, 1]
    assert sampler.can_sample(5, 3) and not sampler.can_sample(5, 4)
    sampler.on_write(torch.tensor([3]))  # slot 3 reused: newest now
    second, _ = sampler.sample(5, 4, seeded())
    assert second.tolist() == [4, 0, 2, 3]
    with pytest.raises(InsufficientItemsError, match="only 0 unserved"):
        sampler.sample(5, 1, seeded())


def test_fifo_overwritten_pending_slot_takes_the_new_order():
    sampler = FifoSampler()
    sampler.on_write(torch.tensor([0, 1, 2]))
    sampler.on_write(torch.tensor([0]))  # evicts the oldest unserved item
    indices, _ = sampler.sample(3, 3, seeded())
    assert indices.tolist() == [1, 2, 0]


@pytest.mark.parametrize("make", [UniformSampler, PrioritizedSampler, FifoSampler])
def test_sampler_state_round_trip_gives_identical_draws(make):
    sampler = make()
    sampler.on_write(torch.arange(6))
    if isinstance(sampler, PrioritizedSampler):
        sampler.update_priorities(torch.arange(6), torch.arange(6.0))
    state = sampler.state_dict()
    restored = make()
    restored.load_state_dict(state)
    a, info_a = sampler.sample(6, 4, seeded(5))
    b, info_b = restored.sample(6, 4, seeded(5))
    assert torch.equal(a, b)
    assert info_a.keys() == info_b.keys()


def test_loading_another_samplers_state_is_refused():
    with pytest.raises(ConfigError, match="saved with sampler 'fifo'"):
        UniformSampler().load_state_dict(FifoSampler().state_dict())


def test_prioritized_checkpoint_with_another_alpha_is_refused():
    state = prioritized_with([1.0, 2.0], alpha=0.5, beta=0.4).state_dict()
    with pytest.raises(ConfigError, match=r"raised to alpha 0.5"):
        PrioritizedSampler(alpha=0.7).load_state_dict(state)


@pytest.mark.parametrize("make", [UniformSampler, FifoSampler])
def test_only_a_prioritized_sampler_takes_initial_priorities(make):
    with pytest.raises(TypeError, match="need sampler 'prioritized'"):
        make().on_write(torch.arange(2), torch.ones(2))
