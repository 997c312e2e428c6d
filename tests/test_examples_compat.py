"""Smoke tests of the migration examples under mpiexec -n 2 (and VirTex's own launcher), tiny budgets.

Each example prints ``FINAL rank r of n params <checksum>`` per rank; the
ranks must agree on their parameters after training (averaged gradients,
identical starts).
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.launching import REPO, run_mpi, run_plain

PY = sys.executable
FINAL = re.compile(r"FINAL rank (\d+) of (\d+) params (-?[\d.]+)")


def finals(output: str) -> dict[int, str]:
    found = {int(rank): (int(size), checksum) for rank, size, checksum in FINAL.findall(output)}
    assert sorted(found) == [0, 1], output
    assert {size for size, _ in found.values()} == {2}, output
    return {rank: checksum for rank, (_, checksum) in found.items()}


@pytest.mark.parametrize(
    "example, args",
    [
        ("spinup_vpg.py", ["--epochs", "2", "--steps", "200"]),
        ("virtex_style.py", ["--num-procs", "2", "--steps", "10"]),
        ("omnisafe_style.py", ["--steps", "20"]),
    ],
)
def test_example_under_mpiexec(example, args):
    result = run_mpi(2, [PY, str(REPO / "examples" / example), *args], timeout=180).check()
    checksums = finals(result.output)
    assert checksums[0] == checksums[1], result.output


def test_virtex_example_with_its_own_launcher():
    result = run_plain([PY, str(REPO / "examples" / "virtex_style.py"), "--num-procs", "2", "--steps", "10"])
    assert result.returncode == 0, result.stdout
    checksums = finals(result.stdout)
    assert checksums[0] == checksums[1], result.stdout
