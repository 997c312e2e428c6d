"""RateLimiter: Reverb's rule, validation with consequences, ratio held, deadlines."""

from __future__ import annotations

import random

import pytest

from gflowdist.errors import ConfigError, DeadlineError
from gflowdist.replay import RateLimiter, wait_until


def test_min_size_only_blocks_sampling_until_the_size():
    limiter = RateLimiter(min_size_to_sample=3)
    limiter.record_insert(2)
    assert not limiter.can_sample(1)
    assert limiter.can_insert(10_000)
    limiter.record_insert(1)
    assert limiter.can_sample(1_000)
    limiter.record_delete(1)
    assert not limiter.can_sample(1)


def test_reverb_rule_at_the_window_edges():
    # m = 2, SPI = 2, T = 3: offset 4, window [1, 7].
    limiter = RateLimiter(min_size_to_sample=2, samples_per_insert=2.0, tolerance=3.0)
    assert limiter.window == (1.0, 7.0)
    assert limiter.can_insert(2)  # size + n <= m: free
    limiter.record_insert(2)  # diff = 4
    assert limiter.can_insert(1)  # 4 + 2 = 6 <= 7
    assert not limiter.can_insert(2)  # 4 + 4 = 8 > 7
    assert limiter.can_sample(3)  # 4 - 3 = 1 >= 1
    assert not limiter.can_sample(4)  # 4 - 4 = 0 < 1
    limiter.record_sample(3)  # diff = 1
    assert not limiter.can_sample(1)
    assert limiter.can_insert(3)  # 1 + 6 = 7 <= 7


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"samples_per_insert": 1.0, "tolerance": 0.0}, "would block sample and/or insert calls"),
        ({"samples_per_insert": 4.0, "tolerance": 3.0}, r"max\(1, samples_per_insert\) = 4"),
        ({"samples_per_insert": 0.0, "tolerance": 3.0}, "replay.samples_per_insert"),
        ({"samples_per_insert": None, "tolerance": 2.0}, "only applies when"),
        ({"min_size_to_sample": -1}, "replay.min_size_to_sample"),
    ],
)
def test_settings_are_validated_with_the_consequence(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        RateLimiter(**kwargs)


def test_a_batch_wider_than_the_window_raises_instead_of_blocking_forever():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, tolerance=2.0)
    limiter.record_insert(1)
    with pytest.raises(ConfigError, match="would block sample calls forever"):
        limiter.can_sample(5)
    limiter.record_insert(2)  # diff 3 = max_diff
    with pytest.raises(ConfigError, match="would block insert calls forever"):
        limiter.can_insert(5)
    with pytest.raises(ConfigError, match="can block forever"):
        limiter.check_batch_sizes(sample_batch=2, insert_batch=3)
    limiter.check_batch_sizes(sample_batch=2, insert_batch=2)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spi, min_size", [(1.0, 10), (4.0, 5), (0.5, 1)])
def test_ratio_held_within_tolerance_over_a_long_random_interleaving(seed, spi, min_size):
    rng = random.Random(seed)
    max_insert, max_sample = 4, 8
    tolerance = (max_sample + max_insert * spi) / 2 + rng.choice([0.0, 1.5, 10.0])
    limiter = RateLimiter(min_size, spi, tolerance)
    limiter.check_batch_sizes(max_sample, max_insert)
    low, high = limiter.window
    for _ in range(3000):
        inserts, samples = rng.randint(1, max_insert), rng.randint(1, max_sample)
        # deadlock-free: with batch sizes that pass check_batch_sizes, one side may go
        assert limiter.can_insert(max_insert) or limiter.can_sample(max_sample)
        if rng.random() < 0.5:
            if limiter.can_insert(inserts):
                limiter.record_insert(inserts)
        elif limiter.can_sample(samples):
            limiter.record_sample(samples)
        assert limiter.diff <= high
        if limiter.size >= min_size:
            assert limiter.diff >= low
            # the ratio error of the stage-2 operations stays within the tolerance
            error = (limiter.inserts - min_size) * spi - limiter.samples
            assert -tolerance <= error <= tolerance
    assert limiter.samples > 0 and limiter.inserts > min_size


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_raises_deadline_error_naming_the_reason():
    limiter = RateLimiter(min_size_to_sample=5)
    with pytest.raises(DeadlineError, match=r"holds 0 < min_size_to_sample 5") as info:
        limiter.wait_until_can_sample(1, timeout=0.02, poll_interval=0.005)
    assert isinstance(info.value, TimeoutError)


def test_wait_calls_progress_until_ready_and_sleeps_between_polls():
    clock, limiter, calls = FakeClock(), RateLimiter(min_size_to_sample=3), []

    def progress() -> None:
        calls.append(clock.now)
        if len(calls) == 4:
            limiter.record_insert(3)

    wait_until(
        lambda: limiter.can_sample(2),
        what="sample 2 items",
        timeout=1.0,
        progress=progress,
        poll_interval=0.1,
        clock=clock,
        sleep=clock.sleep,
    )
    assert len(calls) == 4 and clock.sleeps == pytest.approx([0.1, 0.1, 0.1])


def test_wait_never_sleeps_past_the_deadline():
    clock = FakeClock()
    with pytest.raises(DeadlineError, match=r"could not insert 1 items within 0.25 s"):
        wait_until(
            lambda: False, what="insert 1 items", timeout=0.25, poll_interval=0.1, clock=clock, sleep=clock.sleep
        )
    assert sum(clock.sleeps) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="timeout"):
        wait_until(lambda: True, what="x", timeout=float("nan"))


def test_insert_wait_explains_the_ratio():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, tolerance=1.0)
    limiter.record_insert(2)
    with pytest.raises(DeadlineError, match="inserts would outrun samples"):
        limiter.wait_until_can_insert(1, timeout=0.0)


def test_state_round_trip_restores_counters():
    limiter = RateLimiter(2, 1.0, 2.0)
    limiter.record_insert(5)
    limiter.record_sample(3)
    limiter.record_delete(1)
    restored = RateLimiter(2, 1.0, 2.0)
    restored.load_state_dict(limiter.state_dict())
    assert restored.stats() == limiter.stats()
