"""gflowdist.engines: the one place that says which engines exist and what each can do."""

from __future__ import annotations

import pytest

from gflowdist.config import Config
from gflowdist.engines import CHOICES, ENGINES, LOCAL, MPI, TORCH, engine_named, launched_engine
from gflowdist.errors import ConfigError


def test_the_config_accepts_exactly_the_engines_and_auto():
    assert CHOICES == ("auto", "mpi", "torch", "local")
    for name in CHOICES:
        assert Config.from_dict({"launch": {"engine": name}}).launch.engine == name
    with pytest.raises(ConfigError, match=r"launch.engine: expected one of 'auto', 'mpi', 'torch', 'local'"):
        Config.from_dict({"launch": {"engine": "nccl"}})


def test_how_gflowdist_run_starts_each_engine():
    assert launched_engine("auto") is MPI and MPI.uses_mpiexec
    assert launched_engine("torch") is TORCH and not TORCH.uses_mpiexec and not TORCH.ranks_are_threads
    assert launched_engine("local") is LOCAL and LOCAL.ranks_are_threads and not LOCAL.uses_mpiexec
    with pytest.raises(ValueError, match="unknown engine 'gloo'; expected one of mpi, torch, local"):
        engine_named("gloo")


def test_only_mpi_goes_on_without_a_lost_rank_and_the_others_say_why():
    assert MPI.refuses_actor_loss_continue() is None
    for engine in (TORCH, LOCAL):
        assert engine.refuses_actor_loss_continue() and not engine.survives_lost_peer
    assert set(ENGINES) == {"mpi", "torch", "local"}


def test_only_mpi_replaces_a_lost_actor_and_the_others_say_why():
    assert MPI.replaces_lost_actor and MPI.refuses_actor_loss("replace") is None
    assert MPI.refuses_actor_loss("continue") is None and MPI.refuses_actor_loss("fail") is None
    assert "world size is fixed" in TORCH.refuses_actor_loss("replace")
    assert "threads of one process" in LOCAL.refuses_actor_loss("replace")
    for engine in (TORCH, LOCAL):
        assert not engine.replaces_lost_actor and engine.refuses_actor_loss("fail") is None
