"""gflowdist.compat.omnisafe in one process (a world of one), and fork's translation for torchrun."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gflowdist.comm import reset_world_comm
from gflowdist.compat import omnisafe
from gflowdist.launch import torchrun


@pytest.fixture
def fresh_world():
    reset_world_comm()
    yield
    reset_world_comm()


def test_stray_master_addr_does_not_raise_original_does(monkeypatch, fresh_world):
    """The original calls ``dist.get_rank()`` whenever MASTER_ADDR is set, with no process group: it raises."""
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    assert (omnisafe.get_rank(), omnisafe.world_size(), omnisafe.is_master()) == (0, 1, True)


def test_dist_op_returns_new_float32_original_returns_input():
    """In a world of one the original returns ``torch.as_tensor(value)``: the input tensor itself."""
    x = torch.tensor([1.0, 2.0])
    out = omnisafe.dist_sum(x)
    assert out is not x and out.tolist() == [1.0, 2.0]
    out.add_(5)
    assert x.tolist() == [1.0, 2.0]
    assert omnisafe.dist_avg(np.array([1, 3])).dtype == torch.float32
    scalar = omnisafe.dist_max(2)
    assert scalar.shape == () and float(scalar) == 2
    assert float(omnisafe.dist_op(torch.tensor(4.0, dtype=torch.float64), torch.distributed.ReduceOp.MIN)) == 4


def test_statistics_zero_d_is_one_sample_original_raises():
    """The original calls ``len(value)``: a 0-d tensor raises TypeError."""
    x = torch.tensor(3.0)
    mean, std, lo, hi = omnisafe.dist_statistics_scalar(x, with_min_and_max=True)
    assert [float(v) for v in (mean, std, lo, hi)] == [3.0, 0.0, 3.0, 3.0]
    mean, std = omnisafe.dist_statistics_scalar(torch.tensor([1.0, 3.0]))
    assert (float(mean), float(std)) == (2.0, 1.0)


def test_avg_tensor_zero_d_and_integer():
    x = torch.tensor(2.5)
    omnisafe.avg_tensor(x)
    assert float(x) == 2.5
    with pytest.raises(TypeError):
        omnisafe.avg_tensor(torch.tensor(3))


def test_setup_distributed_world_of_one_changes_nothing(capsys):
    before = torch.get_num_threads()
    omnisafe.setup_distributed()
    assert torch.get_num_threads() == before and capsys.readouterr().out == ""


def test_fork_without_parallelism_returns_false(monkeypatch):
    monkeypatch.setattr(torchrun.subprocess, "call", lambda *a, **k: pytest.fail("must not launch"))
    assert omnisafe.fork(1) is False


def test_fork_translates_flags_for_torchrun_original_passes_mpirun_flags(monkeypatch):
    """The original appends ``-bind-to core`` and ``--use-hwthread-cpus`` to torchrun, which rejects them."""
    seen = {}

    def fake_call(command, env, **options):  # preexec_fn: torchrun dies with its caller
        logs = command[command.index("--log-dir") + 1]
        seen.update(command=command, env=env, logs=logs, logs_there=os.path.isdir(logs))
        return 0

    monkeypatch.setattr(torchrun.subprocess, "call", fake_call)
    assert omnisafe.fork(3, bind_to_core=True, use_number_of_threads=True, manual_args=["train.py", "--x"]) is True
    command = seen["command"]
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert command[command.index("--nproc-per-node") + 1] == "3"
    assert command[-2:] == ["train.py", "--x"]
    assert not {"-bind-to", "--bind-to", "core", "--use-hwthread-cpus"} & set(command)
    assert seen["env"]["GFLOWDIST_BIND_TO"] == "hwthread" and seen["env"]["OMP_NUM_THREADS"] == "1"
    # torchrun's log folder is one of fork's own, there while it runs and gone after (torchrun keeps its own)
    assert seen["logs_there"] and not os.path.exists(seen["logs"])


def test_fork_failure_raises(monkeypatch):
    monkeypatch.setattr(torchrun.subprocess, "call", lambda *a, **k: 1)
    with pytest.raises(Exception, match="workers failed"):
        omnisafe.fork(2, manual_args=["train.py"])


# -- fork: OmniSafe 0.3's and 0.5's signatures ----------------------------------------------


@pytest.fixture
def bound(monkeypatch):
    """What omnisafe.fork hands to torchrun's fork: (parallel, bind_to_core, use_threads, device, manual_args)."""
    seen = []
    monkeypatch.setattr(omnisafe, "_torchrun_fork", lambda *args: seen.append(args) or True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("USE_DISTRIBUTED", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    return seen


def test_fork_binds_positional_arguments_as_each_release(bound, monkeypatch):
    omnisafe.fork(2, True, True, "cpu", ["a.py"])  # 0.3
    omnisafe.fork(2, "cpu", ["b.py"])  # 0.5: the original 0.3 binding would take "cpu" as bind_to_core
    omnisafe.fork(2, False)  # 0.3
    omnisafe.fork(2, device="cpu", manual_args=["c.py"])  # either
    assert bound == [
        (2, True, True, "cpu", ["a.py"]),
        (2, False, False, "cpu", ["b.py"]),
        (2, False, False, "cpu", None),
        (2, False, False, "cpu", ["c.py"]),
    ]


def test_fork_v05_cuda_device_spreads_workers_over_devices(bound):
    import os

    omnisafe.fork(3, "cuda:2")
    assert bound == [(3, False, False, "cuda:2", None)]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3,4" and os.environ["USE_DISTRIBUTED"] == "1"


def test_fork_v05_too_few_visible_devices_raise(bound, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "10,11")  # two devices, five characters: 0.5 counts 3
    with pytest.raises(Exception, match="lists 2 device"):
        omnisafe.fork_v05(3, "cuda:10")
    assert bound == []


def test_fork_refuses_mixed_or_unknown_arguments(bound):
    with pytest.raises(TypeError, match="at most 3 positional"):
        omnisafe.fork(2, "cpu", ["a.py"], 4)
    with pytest.raises(TypeError, match="multiple values for argument 'device'"):
        omnisafe.fork(2, "cpu", device="cpu")
    with pytest.raises(TypeError, match="unexpected keyword argument 'devices'"):
        omnisafe.fork(2, devices="cpu")
    assert bound == []


def test_fork_v03_and_v05_signatures_are_the_releases():
    import inspect

    assert list(inspect.signature(omnisafe.fork_v03).parameters) == [
        "parallel",
        "bind_to_core",
        "use_number_of_threads",
        "device",
        "manual_args",
    ]
    assert list(inspect.signature(omnisafe.fork_v05).parameters) == ["parallel", "device", "manual_args"]
    assert omnisafe.allreduce is omnisafe.all_reduce and omnisafe.allgather is omnisafe.all_gather


def test_statistics_float32_as_original_precise_float64():
    x = torch.tensor([1e4 + 0.01 * i for i in range(7)], dtype=torch.float32)
    mean, std = omnisafe.dist_statistics_scalar(x)
    assert mean.dtype == std.dtype == torch.float32 and mean.ndim == 0
    # the original's arithmetic, in one process
    n = torch.tensor(float(len(x)))
    expect_mean = torch.sum(x) / n
    assert mean.item() == expect_mean.item()
    assert std.item() == torch.sqrt(torch.sum((x - expect_mean) ** 2) / n).item()
    _, p_std = omnisafe.dist_statistics_scalar(x, precise=True)
    assert p_std.item() == pytest.approx(float(np.std(x.numpy().astype(np.float64))), rel=1e-6)
