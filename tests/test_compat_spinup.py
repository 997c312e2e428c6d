"""gflowdist.compat.spinup in one process (a world of one), and mpi_fork's command line.

Multi-rank behaviour is in tests/ranked/test_compat.py; launching for real
is in tests/test_launchers.py.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from gflowdist.compat import spinup
from gflowdist.launch import jobs, mpiexec


def test_world_of_one_answers():
    assert (spinup.proc_id(), spinup.num_procs()) == (0, 1)
    scalar = spinup.mpi_avg(3)
    assert np.isscalar(scalar) and scalar.dtype == np.float32 and scalar == 3
    vector = spinup.mpi_avg([1, 2.5])
    assert isinstance(vector, np.ndarray) and vector.dtype == np.float32 and vector.tolist() == [1, 2.5]
    assert spinup.mpi_avg(torch.tensor([4.0])).tolist() == [4.0]
    assert spinup.mpi_op(2, "max") == 2


def test_statistics_flatten_multidim_original_miscounts():
    """The original divides the sum of all elements by ``len(x)`` (the number of rows)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    mean, std, lo, hi = spinup.mpi_statistics_scalar(x, with_min_and_max=True)
    assert mean == pytest.approx(x.mean()) and std == pytest.approx(x.std(ddof=0))
    assert (lo, hi) == (0.0, 5.0)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_statistics_population_std():
    values = [1.0, 2.0, 4.0, 7.0]
    assert spinup.mpi_statistics_scalar(values) == (
        pytest.approx(np.mean(values)),
        pytest.approx(np.std(values, ddof=0)),
    )


def test_allreduce_broadcast_msg(capsys):
    send = np.array([1.0, 2.0])
    recv = np.zeros(2)
    spinup.allreduce(send, recv)
    assert recv.tolist() == [1.0, 2.0]
    x = np.array([5, 6])
    spinup.broadcast(x)
    assert x.tolist() == [5, 6]
    spinup.msg("hello", "note")
    assert "Message from 0: note" in capsys.readouterr().out


def test_setup_pytorch_for_mpi_keeps_threads_in_world_of_one():
    before = torch.get_num_threads()
    spinup.setup_pytorch_for_mpi()
    assert torch.get_num_threads() == before


def test_mpi_avg_grads_and_sync_params_world_of_one():
    model = torch.nn.Linear(2, 1)
    model.weight.grad = torch.ones_like(model.weight)
    weight = model.weight.detach().clone()
    spinup.mpi_avg_grads(model)
    spinup.sync_params(model)
    assert torch.equal(model.weight.grad, torch.ones_like(model.weight)) and model.bias.grad is None
    assert torch.equal(model.weight.detach(), weight)


def _no_launch(*args, **kwargs):
    raise AssertionError(f"mpi_fork launched {args} although it must not")


def test_mpi_fork_returns_for_one_rank(monkeypatch):
    monkeypatch.setattr(mpiexec.subprocess, "call", _no_launch)
    assert spinup.mpi_fork(1) is None


@pytest.mark.parametrize("variable", ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "IN_MPI"])
def test_mpi_fork_inside_a_job_returns_original_checks_in_mpi_only(monkeypatch, variable):
    """The original only checks IN_MPI: under a bare ``mpiexec -n 2`` it launches 2 x n ranks."""
    monkeypatch.setattr(mpiexec.subprocess, "call", _no_launch)
    monkeypatch.setenv(variable, "1")
    assert spinup.mpi_fork(4) is None


@pytest.mark.parametrize("open_mpi", [False, True])
def test_mpi_fork_command_keeps_module_and_flags_per_launcher(monkeypatch, open_mpi):
    """``python -m pkg.job --x 1`` is re-run as a module (the original re-runs ``sys.argv``: the file)."""
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-u", "-m", "pkg.job", "--x", "1"])
    monkeypatch.setattr(sys, "argv", ["/somewhere/pkg/job.py", "--x", "1"])
    monkeypatch.setattr(mpiexec, "is_open_mpi", lambda _: open_mpi)
    command = mpiexec.mpi_fork_command(3, bind_to_core=True)
    assert command[1:3] == ["-n", "3"]
    assert command[-6:] == [sys.executable, "-u", "-m", "pkg.job", "--x", "1"]
    assert ("--oversubscribe" in command) == open_mpi
    assert ("--bind-to" if open_mpi else "-bind-to") in command


def test_find_mpiexec_prefers_the_interpreters_own():
    found = jobs.find_mpiexec()
    assert found.endswith(("mpiexec", "mpirun"))


def test_statistics_float32_as_original_precise_float64():
    """The original's float32 arithmetic by default (numpy float32 out); float64 with ``precise=True``."""
    x = np.float32(1e4) + np.float32(0.01) * np.arange(7, dtype=np.float32)
    mean, std, lo, hi = spinup.mpi_statistics_scalar(x, with_min_and_max=True)
    assert all(type(v) is np.float32 for v in (mean, std, lo, hi))
    n = np.float32(len(x))
    assert mean == np.sum(x) / n and std == np.sqrt(np.sum((x - np.sum(x) / n) ** 2) / n)
    p_mean, p_std = spinup.mpi_statistics_scalar(x, precise=True)
    assert type(p_mean) is float and p_std == pytest.approx(float(np.std(x.astype(np.float64))), rel=1e-9)


def test_mpi_op_zero_d_stays_an_array_as_in_the_original():
    out = spinup.mpi_sum(np.array(2.5))
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float32
    assert type(spinup.mpi_sum(np.float64(1.5))) is np.float32
