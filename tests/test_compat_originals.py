"""Differential tests: each original library's helpers and gflowdist.compat, the same inputs, the same bits.

- Spinning Up (the verbatim ``mpi_tools`` / ``mpi_pytorch`` in tests/originals)
  under ``mpiexec -n 1/2/3``, and a seeded PPO-style loop through the compat
  module, through a direct mpi4py implementation of the original's arithmetic
  and through the original (tests/jobs/spinup_differential.py);
- OmniSafe 0.5.0's ``utils/distributed.py`` from its wheel, as 1-3 gloo
  processes (torchrun's setting; tests/jobs/omnisafe_differential.py);
- torchgfn's ``gfn/utils/distributed.py``, 2.4.1 from its wheel and the newest
  (kept in tests/originals), as 1-3 gloo processes: averaging and gathering
  (tests/jobs/torchgfn_differential.py; RankLayout is compared in
  tests/test_compat_torchgfn_layout.py).

Where an original cannot be obtained the test skips and says why
(tests/support/originals.py).
"""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.launching import run_mpi, run_torch
from tests.support.originals import omnisafe_distributed, torchgfn_distributed, torchgfn_newest_distributed

SPINUP_JOB = "tests/jobs/spinup_differential.py"
OMNISAFE_JOB = "tests/jobs/omnisafe_differential.py"
TORCHGFN_JOB = "tests/jobs/torchgfn_differential.py"


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_spinup_same_bits_and_seeded_ppo(nprocs):
    result = run_mpi(nprocs, [sys.executable, SPINUP_JOB], timeout=300).check()
    out = result.output
    # every rank reached the end of the helper comparisons (lines may be glued together by mpiexec)
    assert out.count(f"SPINUP DIFFERENTIAL OK {nprocs}") == nprocs, out[-3000:]
    for name in (
        "mpi_avg_grads",
        "sync_params",
        "msg",
        "setup_pytorch_for_mpi",
        "mpi_avg(0-d tensor)",
        "mpi_statistics_scalar(empty on rank 1, with_min_and_max=True)",
        "mpi_statistics_scalar(large mean, with_min_and_max=False)",
    ):
        assert f"SAME {name}" in out, f"check {name} did not run:\n{out[-3000:]}"
    ppo = re.findall(r"PPO SAME (\d+) ([0-9a-f]{16}) kl_stops=(\d+) precise=([0-9a-f]{16})", out)
    assert len(ppo) == nprocs, out[-3000:]
    sizes, digests, stops, precise = zip(*ppo, strict=True)
    assert set(sizes) == {str(nprocs)} and len(set(digests)) == 1
    # the KL early stop took part, and the loop is sensitive to the statistics' last bits: the
    # float64 statistics give other weights (so equal digests above are not a loop that ignores them)
    assert int(stops[0]) > 0
    assert precise[0] != digests[0]


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_omnisafe_05_same_bits(nprocs):
    original = omnisafe_distributed()
    result = run_torch(nprocs, [sys.executable, OMNISAFE_JOB, str(original)], timeout=300).check()
    out = result.output
    assert out.count(f"OMNISAFE DIFFERENTIAL OK {nprocs}") == nprocs, out[-3000:]
    for name in ("dist_statistics_scalar(uneven lengths)", "avg_grads", "avg_params", "dist_avg(float32 tensor)"):
        assert out.count(f"SAME {name}\n") == nprocs, f"check {name} missing:\n{out[-3000:]}"


@pytest.mark.parametrize("version,nprocs", [("2.4.1", 1), ("2.4.1", 2), ("2.4.1", 3), ("newest", 3)])
def test_torchgfn_same_bits(version, nprocs):
    original = torchgfn_distributed() if version == "2.4.1" else torchgfn_newest_distributed()
    result = run_torch(nprocs, [sys.executable, TORCHGFN_JOB, str(original)], timeout=300).check()
    out = result.output
    assert out.count(f"TORCHGFN DIFFERENTIAL OK {nprocs}") == nprocs, out[-3000:]
    for name in ("average_gradients", "average_models", "gather_distributed_data"):
        assert out.count(f"SAME {name}\n") == nprocs, f"check {name} missing:\n{out[-3000:]}"
