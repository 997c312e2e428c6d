"""The runtime's settings: resolved once from the config, frozen, every timeout's multiple named once."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from gflowdist.config import Config
from gflowdist.runtime.settings import POSTMORTEM_CAP_S, Settings


def _settings(**faults: float) -> Settings:
    return Settings.of(Config.from_dict({"faults": faults}))


def test_each_timeout_is_its_named_multiple_of_the_peer_timeout() -> None:
    s = _settings(peer_timeout_s=4.0, heartbeat_s=0.25, preempt_grace_s=30.0)
    assert (s.reply_timeout_s, s.weights_timeout_s, s.refusals_wait_s, s.collector_silence_s) == (4.0,) * 4
    assert (s.silence_after_death_s, s.named_death_wait_s) == (12.0, 8.0)
    assert s.send_timeout_s == 4.0 and s.postmortem_wait_s == 4.0
    assert s.launcher_grace_s == 18.0 and s.keeper_bound_s == 6.0
    assert s.summary_every_s == 0.5  # a buffer's summary at most twice a second, however fast the beats
    slow = _settings(peer_timeout_s=60.0, heartbeat_s=2.0, preempt_grace_s=90.0)
    assert slow.postmortem_wait_s == POSTMORTEM_CAP_S and slow.summary_every_s == 2.0
    quick = _settings(peer_timeout_s=0.5, heartbeat_s=0.1)
    assert quick.send_timeout_s == 1.0  # a blocked send waits at least a second


def test_settings_carry_the_configs_values_and_cannot_change() -> None:
    config = Config.from_dict(
        {"run": {"steps": 7, "log_every": 3}, "replay": {"replay_fraction": 0.5, "max_staleness": 2}}
    )
    s = Settings.of(config)
    assert (s.steps, s.log_every, s.max_staleness, s.replay_fraction) == (7, 3, 2, 0.5)
    assert s.replayed_per_step(16) == config.replay.replayed_per_step(16) == 16
    assert s.sync is config.sync and s.learner is config.learner
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.peer_timeout_s = 1.0  # type: ignore[misc]


def test_the_launcher_reads_the_settings_without_loading_torch() -> None:
    code = "import sys, gflowdist.runtime.settings; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
