"""Launcher detection from the environment, and the guard against N singleton 'jobs'."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gflowdist.jobenv import in_mpi_job, in_torch_job, mpi_world_mismatch
from tests.support.launching import REPO, base_env

TOY = REPO / "tests" / "jobs" / "toy.yaml"


@pytest.mark.parametrize(
    "variables,mpi,torch_job",
    [
        ({}, False, False),
        ({"PMI_RANK": "0"}, True, False),
        ({"OMPI_COMM_WORLD_RANK": "1"}, True, False),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}, False, True),
        ({"RANK": "0", "WORLD_SIZE": "2"}, False, False),  # half a rendezvous is no job
    ],
)
def test_launchers_are_recognised_from_their_variables(monkeypatch, variables, mpi, torch_job):
    for name in (
        "PMI_RANK",
        "PMI_FD",
        "PMIX_RANK",
        "OMPI_COMM_WORLD_RANK",
        "HYDRA_CONTROL_FD",
        "IN_MPI",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert in_mpi_job() is mpi and in_torch_job() is torch_job


def test_a_world_that_differs_from_the_launchers_is_named(monkeypatch):
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "8")  # an allocation may be larger than the mpiexec inside it
    assert mpi_world_mismatch(1) is None
    monkeypatch.setenv("PMI_SIZE", "4")
    assert mpi_world_mismatch(4) is None
    message = mpi_world_mismatch(1)
    assert message is not None and "world of 1" in message and "PMI_SIZE=4" in message


def test_run_under_a_foreign_launcher_stops_instead_of_running_alone():
    """Open MPI's mpirun starting an MPICH mpi4py: each process would be a world of one."""
    env = base_env(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="2")
    out = subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", str(TOY), "run.steps=3"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode != 0
    assert "MPI sees a world of 1 rank(s), but the launcher announced OMPI_COMM_WORLD_SIZE=4" in out.stderr
    assert "Traceback" not in out.stderr
