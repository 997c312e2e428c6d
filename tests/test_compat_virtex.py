"""gflowdist.compat.virtex in one process (a world of one) and launch's argument checks."""

from __future__ import annotations

import os

import pytest
import torch

from gflowdist.compat import virtex
from gflowdist.errors import ConfigError
from gflowdist.launch import resolve_dist_url


def test_world_of_one_identity():
    assert (virtex.get_rank(), virtex.get_world_size(), virtex.is_master_process()) == (0, 1, True)
    virtex.synchronize()


def test_launch_world_of_one_runs_in_the_calling_process():
    seen = []
    virtex.launch(lambda a, b: seen.append((os.getpid(), a + b)), args=(2, 3))
    assert seen == [(os.getpid(), 5)]


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"num_machines": 0}, "num_machines"),
        ({"num_gpus_per_machine": -1}, "num_gpus_per_machine"),
        ({"num_machines": 2, "machine_rank": 2}, "machine_rank"),
        ({"num_machines": 2, "dist_url": "tcp://127.0.0.1:0"}, "dist_url"),
        ({"num_machines": 2, "dist_url": "auto"}, "dist_url"),
    ],
)
def test_launch_rejects_bad_arguments(kwargs, key):
    with pytest.raises(ConfigError) as info:
        virtex.launch(lambda: None, **kwargs)
    assert info.value.key == key


def test_dist_url_auto_picks_a_port():
    url = resolve_dist_url("auto")
    assert url.startswith("tcp://127.0.0.1:") and int(url.rsplit(":", 1)[1]) > 0
    assert resolve_dist_url("tcp://localhost:0").startswith("tcp://localhost:")
    assert resolve_dist_url("tcp://10.1.2.3:4567", 2) == "tcp://10.1.2.3:4567"
    assert resolve_dist_url("env://") == "env://"


def test_average_across_processes_world_of_one():
    values = {"a": torch.tensor(1.5), "b": {"c": torch.ones(2)}}
    virtex.average_across_processes(values)
    assert float(values["a"]) == 1.5 and values["b"]["c"].tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="int64"):
        virtex.average_across_processes({"n": torch.tensor(3)})
    with pytest.raises(TypeError, match="float"):
        virtex.average_across_processes({"x": 1.0})


def test_gpu_mem_usage_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert virtex.gpu_mem_usage() == 0


def test_launch_inside_a_job_of_another_size_raises(monkeypatch):
    """Inside a running job launch() spawns nothing; the job's size must be the one asked for."""
    from gflowdist.launch import spawn, torchrun

    ran = []
    monkeypatch.setattr(spawn, "existing_job", lambda: "mpi")
    monkeypatch.setattr(torchrun, "ensure_process_group", lambda device="cpu": "mpi")
    with pytest.raises(ConfigError, match="asked for 3 processes, but it runs inside a job of 1 ranks"):
        virtex.launch(ran.append, num_gpus_per_machine=3, args=("x",))
    virtex.launch(ran.append, num_gpus_per_machine=1, args=("x",))
    assert ran == ["x"]
