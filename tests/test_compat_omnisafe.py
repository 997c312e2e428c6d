"""gflowdist.compat.omnisafe in one process (a world of one), and fork's translation for torchrun."""

from __future__ import annotations

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

    def fake_call(command, env):
        seen.update(command=command, env=env)
        return 0

    monkeypatch.setattr(torchrun.subprocess, "call", fake_call)
    assert omnisafe.fork(3, bind_to_core=True, use_number_of_threads=True, manual_args=["train.py", "--x"]) is True
    command = seen["command"]
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert command[command.index("--nproc-per-node") + 1] == "3"
    assert command[-2:] == ["train.py", "--x"]
    assert not {"-bind-to", "--bind-to", "core", "--use-hwthread-cpus"} & set(command)
    assert seen["env"]["GFLOWDIST_BIND_TO"] == "hwthread" and seen["env"]["OMP_NUM_THREADS"] == "1"


def test_fork_failure_raises(monkeypatch):
    monkeypatch.setattr(torchrun.subprocess, "call", lambda *a, **k: 1)
    with pytest.raises(Exception, match="workers failed"):
        omnisafe.fork(2, manual_args=["train.py"])
