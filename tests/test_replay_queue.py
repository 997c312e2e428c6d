"""The on-policy queue, samplers that read the items' stamps, and samplers/writers by name with options."""

from __future__ import annotations

import pytest
import torch

from gflowdist.config import Config
from gflowdist.config.checks import IntCheck
from gflowdist.errors import ConfigError
from gflowdist.replay import ReplayBuffer, Sampler
from gflowdist.replay.registry import Option, register_sampler


def batch(values):
    return {"x": torch.tensor(values, dtype=torch.float32)[:, None]}


def test_a_queue_serves_each_item_once_oldest_first_and_drops_stale_ones():
    q = ReplayBuffer.queue(6)
    q.extend(batch([0, 1, 2]), producer=1, seq=0, policy_version=0)
    q.extend(batch([3, 4]), producer=2, seq=0, policy_version=2)
    assert q.has_room(1) and not q.has_room(2)
    out, info = q.sample(2, step=2)
    assert out["x"].flatten().tolist() == [0, 1] and info["policy_version"].tolist() == [0, 0]
    # at learner version 3 with max_staleness 2, the item of version 0 (lag 3) is dropped unserved
    assert q.drop_stale(3, 2) == 1 and q.counters["stale"] == 1 and len(q) == 2
    out, info = q.sample(2, step=3)
    assert out["x"].flatten().tolist() == [3, 4] and info["producer"].tolist() == [2, 2]
    assert not q.can_sample(1) and len(q) == 0  # nothing is served twice


class FreshestFirst(Sampler):
    """The example of samplers.py: consumes the ``n`` live items of the newest policy version, served at
    most ``max_lag`` versions behind ``step``."""

    name, consumes = "freshest_first", True

    def __init__(self, max_lag: int = 10):
        self.max_lag = max_lag

    def can_sample(self, storage_len, n):
        return storage_len >= n

    def sample(self, storage_len, n, generator, step=0):
        slots = self.items.live()
        versions = self.items.policy_version(slots)
        order = torch.argsort(versions, descending=True, stable=True)[:n]
        if bool((step - versions[order] > self.max_lag).any()):
            raise LookupError("too stale")
        versions[:] = -1  # a copy: the buffer's stamps stay as they are
        return slots[order], {}


def test_a_staleness_aware_sampler_is_a_few_lines_on_the_stamps_and_is_chosen_by_name():
    register_sampler("freshest_first", FreshestFirst, {"max_lag": Option(10, IntCheck(low=0), "largest lag served")})
    config = Config.from_dict({"replay": {"capacity": 8, "sampler": {"name": "freshest_first", "max_lag": 3}}})
    assert config.replay.sampler == {"name": "freshest_first", "max_lag": 3}
    buffer = ReplayBuffer.from_config(config.replay)
    assert isinstance(buffer.sampler, FreshestFirst) and buffer.sampler.max_lag == 3
    for version in (4, 1, 6, 5):
        buffer.extend(batch([10 * version]), producer=version, seq=0, policy_version=version)
    out, info = buffer.sample(2, step=7)
    assert out["x"].flatten().tolist() == [60, 50] and info["policy_version"].tolist() == [6, 5]
    assert buffer.metadata["policy_version"][:4].tolist() == [4, 1, 6, 5]  # the view's copies were written, not these
    assert buffer.sampler.items.admission(torch.tensor([0, 3])).tolist() == [0, 3]
    assert buffer.sampler.items.producer().tolist()[:4] == [4, 1, 6, 5]
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"replay": {"sampler": {"name": "freshest_first", "max_lagg": 3}}})
    assert err.value.key == "replay.sampler.max_lagg" and "did you mean 'max_lag'" in str(err.value)


def test_nested_and_flat_spellings_give_the_same_prioritized_sampler():
    nested = Config.from_dict({"replay": {"sampler": {"name": "prioritized", "alpha": 0.5, "beta": 0.3}}})
    flat = Config.from_dict({"replay": {"sampler": "prioritized", "priority_alpha": 0.5, "priority_beta": 0.3}})
    assert nested == flat and nested.replay.priority_alpha == 0.5  # the old keys still read
    assert nested.replay.sampler == {
        "name": "prioritized", "alpha": 0.5, "beta": 0.3, "eps": 1e-6, "beta_final": None, "beta_steps": 0,
    }  # fmt: skip
    sampler = ReplayBuffer.from_config(nested.replay).sampler
    assert (sampler.alpha, sampler.beta) == (0.5, 0.3)
    assert Config.from_dict(nested.to_dict()) == nested
    overridden = nested.apply_overrides(["replay.sampler.alpha=0.7", "replay.sampler=uniform"])
    assert overridden.replay.sampler == {"name": "uniform"} and overridden.replay.priority_alpha is None
    assert nested.apply_overrides(["replay.sampler.beta=0.9"]).replay.sampler["beta"] == 0.9
    dedup = Config.from_dict({"replay": {"writer": "dedup", "dedup_key": "terminal"}})
    assert dedup.replay.writer == {"name": "dedup", "key": "terminal"}
    assert ReplayBuffer.from_config(dedup.replay).writer.key == "terminal"


@pytest.mark.parametrize(
    "replay, key, line",
    [
        (
            {"priority_alpha": 0.5},
            "replay.priority_alpha",
            "applies to sampler 'prioritized' only, and replay.sampler is 'uniform' "
            "(new spelling: replay.sampler: {name: prioritized, alpha: 0.5})",
        ),
        (
            {"sampler": {"name": "prioritized", "alpha": 0.6}, "priority_alpha": 0.5},
            "replay.priority_alpha",
            "is 0.5 but replay.sampler.alpha is 0.6; give it once, as replay.sampler: {name: prioritized, alpha: ...}",
        ),
        (
            {"sampler": {"name": "prioritized", "alpha": -1}},
            "replay.sampler.alpha",
            "expected a finite number >= 0.0, found int -1",
        ),
        ({"sampler": "quene"}, "replay.sampler", "unknown sampler 'quene' (did you mean 'queue'?)"),
        (
            {"sampler": "queue", "capacity": 8, "learner_batch": 16},
            "replay.capacity",
            "is 8, smaller than one learner batch (replay.learner_batch = 16): the queue could never serve a batch",
        ),
    ],
)
def test_replay_parts_refuse_bad_settings_in_one_line_naming_the_key(replay, key, line):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"replay": replay})
    assert err.value.key == key
    assert line in str(err.value) and "\n" not in str(err.value)
