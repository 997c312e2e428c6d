"""The choice of how an agent group averages (gflowdist.devices.choose_averaging), a pure decision."""

from __future__ import annotations

from gflowdist.devices import choose_averaging


def test_each_trainer_on_its_own_gpu_averages_on_nccl_with_the_torch_engine():
    choice = choose_averaging("torch", [(0, "a", "cuda:0"), (1, "a", "cuda:1"), (2, "b", "cuda:0")])
    assert (choice.path, choice.engine) == ("nccl", "nccl")
    assert choice.describe() == "nccl on the GPUs: every trainer of the group has a GPU of its own"


def test_two_trainers_on_one_gpu_average_through_host_memory():
    torch_choice = choose_averaging("torch", [(0, "a", "cuda:0"), (3, "a", "cuda:0")])
    assert (torch_choice.path, torch_choice.engine) == ("host", "gloo")
    assert torch_choice.reason == "ranks 0 and 3 share cuda:0 on a (nccl refuses two ranks on one GPU)"
    mpi_choice = choose_averaging("mpi", [(0, "a", "cuda:0"), (1, "b", "cuda:1"), (2, "b", "cuda:1")])
    assert (mpi_choice.path, mpi_choice.engine) == ("host", "mpi")
    assert "ranks 1 and 2 share cuda:1 on b" in mpi_choice.reason


def test_the_same_gpu_index_on_two_hosts_is_not_shared():
    assert choose_averaging("torch", [(0, "a", "cuda:0"), (1, "b", "cuda:0")]).path == "nccl"


def test_a_trainer_on_the_cpu_or_the_mpi_engine_means_host_memory():
    mixed = choose_averaging("torch", [(0, "a", "cuda:0"), (1, "a", "cpu"), (2, "a", "cpu")])
    assert (mixed.path, mixed.engine) == ("host", "gloo")
    assert mixed.reason.startswith("ranks 1, 2 on the CPU")
    mpi = choose_averaging("mpi", [(0, "a", "cuda:0"), (1, "a", "cuda:1")])
    assert (mpi.path, mpi.engine) == ("host", "mpi") and "launch.engine: torch averages on nccl" in mpi.reason
    cpu = choose_averaging("mpi", [(0, "a", "cpu"), (1, "a", "cpu")])
    assert cpu.path == "host" and cpu.reason == "every trainer of the group computes on the CPU"


def test_a_group_of_one_averages_nothing():
    choice = choose_averaging("torch", [(0, "a", "cuda:0")])
    assert choice.path == "none" and choice.describe() == "nothing to average: a group of one trainer"
