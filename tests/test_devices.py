"""Device placement decisions (gflowdist.devices): pure functions, so every case runs without a GPU."""

from __future__ import annotations

import pytest

from gflowdist.config import Config, ConfigError
from gflowdist.devices import DeviceChoice, choose_device, local_rank, replacement_device


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"LOCAL_RANK": "3", "RANK": "7"}, (3, "LOCAL_RANK=3 (torchrun)")),
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_RANK": "6"},
            (2, "OMPI_COMM_WORLD_LOCAL_RANK=2 (Open MPI)"),
        ),
        ({"MPI_LOCALRANKID": "1", "PMI_RANK": "5"}, (1, "MPI_LOCALRANKID=1 (MPICH hydra)")),
        ({"MV2_COMM_WORLD_LOCAL_RANK": "1"}, (1, "MV2_COMM_WORLD_LOCAL_RANK=1 (MVAPICH2)")),
        ({"PMI_LOCAL_RANK": "4"}, (4, "PMI_LOCAL_RANK=4 (Cray PMI)")),
        ({"SLURM_LOCALID": "2", "SLURM_PROCID": "10"}, (2, "SLURM_LOCALID=2 (Slurm)")),
        # mpiexec inside an sbatch script: the batch step's SLURM_LOCALID=0 is inherited by every rank
        ({"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "3"}, (3, "MPI_LOCALRANKID=3 (MPICH hydra)")),
        ({"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (1, "OMPI_COMM_WORLD_LOCAL_RANK=1 (Open MPI)")),
        # torchrun inside an allocation
        ({"SLURM_LOCALID": "0", "LOCAL_RANK": "2"}, (2, "LOCAL_RANK=2 (torchrun)")),
    ],
)
def test_local_rank_comes_from_the_launcher_that_started_the_rank(env, expected):
    assert local_rank(env, global_rank=99) == expected


def test_without_a_launcher_variable_the_global_rank_stands_in_and_says_so():
    rank, where = local_rank({"PMI_RANK": "5"}, global_rank=5)
    assert rank == 5 and "no launcher variable names the local rank" in where
    assert local_rank({})[0] == 0


def test_a_malformed_launcher_variable_is_named():
    with pytest.raises(ConfigError, match="MPI_LOCALRANKID='x' should be a local rank"):
        local_rank({"MPI_LOCALRANKID": "x"})


def test_auto_gives_each_local_rank_its_gpu_and_shares_round_robin_when_ranks_outnumber_gpus():
    assert [choose_device("auto", local, 4).device for local in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    six_on_four = [choose_device("auto", local, 4) for local in range(6)]
    assert [c.device for c in six_on_four] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert "shared with local rank 1" in six_on_four[5].reason and "shared" not in six_on_four[1].reason
    assert six_on_four[5].cuda_index == 1


def test_one_gpu_per_rank_from_the_launcher_means_cuda_0_everywhere():
    # srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES to one GPU per rank: each rank's torch sees 1 device
    assert [choose_device("auto", local, 1).device for local in range(4)] == ["cuda:0"] * 4
    # CUDA_VISIBLE_DEVICES="" (or -1): torch sees none, and auto stays on the CPU
    assert choose_device("auto", 2, 0).device == "cpu"


def test_auto_without_gpus_and_cpu_with_gpus_stay_on_the_cpu():
    assert choose_device("auto", 3, 0).device == "cpu"
    assert choose_device("cpu", 0, 8).device == "cpu"
    assert choose_device("cpu", 0, 8).cuda_index is None


def test_cuda_without_a_visible_gpu_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"launch.devices: asks for cuda, but this rank sees no CUDA device"):
        choose_device("cuda", 1, 0, where="MPI_LOCALRANKID=1 (MPICH hydra)")


def test_a_device_list_is_indexed_by_local_rank_and_cycled():
    setting = ("cuda:1", "cuda:0", "cpu")
    assert [choose_device(setting, local, 2).device for local in range(5)] == [
        "cuda:1",
        "cuda:0",
        "cpu",
        "cuda:1",
        "cuda:0",
    ]
    assert choose_device(("cuda", "cpu"), 2, 4).device == "cuda:2"  # "cuda" in a list: by local rank
    with pytest.raises(ConfigError, match=r"entry 0 of launch.devices .* is cuda:3, but this rank sees 2 visible"):
        choose_device(("cuda:3",), 0, 2)


def test_launch_devices_is_checked_when_the_config_loads():
    assert Config.from_dict({"launch": {"devices": ["cuda:0", "cpu"]}}).launch.devices == ("cuda:0", "cpu")
    assert Config().launch.devices == "auto"
    with pytest.raises(ConfigError, match=r"launch.devices: .* found str 'gpu' \(did you mean 'cpu'\?\)"):
        Config.from_dict({"launch": {"devices": "gpu"}})
    with pytest.raises(ConfigError, match="the entry str 'cuda:x' is not cpu, cuda or cuda:N"):
        Config.from_dict({"launch": {"devices": ["cuda:x"]}})


def test_the_rank_is_put_on_its_gpu_before_anything_else(monkeypatch):
    """run_job's first step on a node with 4 GPUs, seen through a fake torch.cuda (no GPU here)."""
    import torch

    from gflowdist.runtime.device_setup import setup_device

    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for name in (
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MV2_COMM_WORLD_LOCAL_RANK",
        "PMI_LOCAL_RANK",
        "SLURM_LOCALID",
        "RANK",
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "MV2_COMM_WORLD_RANK",
        "SLURM_PROCID",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPI_LOCALRANKID", "6")
    monkeypatch.setenv("PMI_RANK", "15")
    choice = setup_device("auto")
    assert choice.device == "cuda:2" and current == [2] and "MPI_LOCALRANKID=6" in choice.reason
    assert setup_device("cpu").device == "cpu" and current == [2]  # forced CPU: no CUDA call at all
    monkeypatch.delenv("MPI_LOCALRANKID")
    assert setup_device(("cuda:3", "cuda:1")).device == "cuda:1"  # no local rank: global rank 15 stands in
    assert current == [2, 1]


def test_launcher_rank_reads_the_global_rank_each_launcher_announces():
    from gflowdist.devices import launcher_rank

    assert launcher_rank({"PMI_RANK": "3"}) == 3 and launcher_rank({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert launcher_rank({"RANK": "2", "SLURM_PROCID": "9"}) == 2 and launcher_rank({}) == 0


def test_only_a_setting_that_asks_for_cuda_can_fail_without_a_gpu():
    from gflowdist.devices import needs_cuda

    assert not needs_cuda("auto") and not needs_cuda("cpu") and not needs_cuda(("cpu", "cpu"))
    assert needs_cuda("cuda") and needs_cuda(("cuda:7",)) and needs_cuda(("cpu", "cuda"))
    with pytest.raises(ConfigError, match="asks for cuda, but this host sees no CUDA device"):
        choose_device("cuda", 0, 0, seen_by="this host")


def _launch(**launch):
    from gflowdist.config import Config

    return Config.from_dict({"launch": launch}, file="config.yaml")


def test_the_launcher_judges_devices_only_for_ranks_that_run_on_its_host():
    from gflowdist.cli.preflight import devices_judged_here

    assert devices_judged_here(_launch(devices="cuda"), 3, env={})
    assert devices_judged_here(_launch(devices=["cpu", "cuda:1"]), 3, env={})
    assert not devices_judged_here(_launch(devices="auto"), 3, env={})  # auto never fails
    assert not devices_judged_here(_launch(devices="cuda", mpiexec_args=["-f", "hosts.txt"]), 3, env={})
    assert not devices_judged_here(_launch(devices="cuda", mpiexec_args=["--hostfile=h"]), 3, env={})
    assert not devices_judged_here(
        _launch(devices="cuda", mpiexec_args=["-genv", "CUDA_VISIBLE_DEVICES", "1"]), 3, env={}
    )
    assert not devices_judged_here(_launch(devices="cuda"), 3, env={"SLURM_JOB_ID": "42"})  # mpiexec spreads them
    assert devices_judged_here(_launch(devices="cuda", engine="torch"), 3, env={"SLURM_JOB_ID": "42"})  # local


def test_the_launcher_names_the_first_rank_it_cannot_place_and_the_fix(monkeypatch):
    from gflowdist.cli.preflight import check_devices

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check_devices(_launch(devices=["cuda:0", "cuda:1"]), 4, 2)  # local ranks 2 and 3 cycle back: fine
    with pytest.raises(ConfigError) as info:
        check_devices(_launch(devices=["cuda:0", "cuda:3"]), 4, 2)
    assert str(info.value) == (
        "config.yaml: launch.devices: entry 1 of launch.devices (local rank 1: 4 ranks, all on "
        "this host) is cuda:3, but this host sees 2 visible CUDA devices: list only cuda:0 to "
        "cuda:1 (or cuda, or auto)"
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ConfigError, match=r"run where torch sees a GPU \(CUDA_VISIBLE_DEVICES='' is set\)$"):
        check_devices(_launch(devices="cuda"), 1, 0)


def test_a_replacement_computes_where_the_rank_it_replaces_did_and_says_why():
    assert replacement_device("auto", 2, "cuda:1", 2) == DeviceChoice("cuda:1", "as rank 2, which it replaces")
    assert replacement_device(("cpu", "cuda"), 3, "cpu", 4) == DeviceChoice("cpu", "as rank 3, which it replaces")
    # not known (no devices gathered): the rule, with the global rank standing in for the local one
    assert replacement_device("auto", 3, None, 2).device == "cuda:1"
    assert "the global rank of the lost rank" in replacement_device("auto", 3, None, 2).reason
    assert replacement_device("auto", 3, None, 0).device == "cpu"
    with pytest.raises(
        ConfigError,
        match=r"launch.devices.*gave rank 2 cuda:1, but the process that replaces it "
        r"sees 1 visible CUDA device",
    ):
        replacement_device("auto", 2, "cuda:1", 1)
