"""Top-level re-exports of the compat names: lazy, unique, pointing at the right original."""

from __future__ import annotations

import subprocess
import sys

import gflowdist
from gflowdist.compat import evorl, omnisafe, spinup, virtex
from gflowdist.ops import DistributedOptimizer


def test_import_stays_light():
    code = "import sys, gflowdist; gflowdist.__version__; print('torch' in sys.modules, 'mpi4py' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_names_resolve_to_their_original_module():
    assert gflowdist.mpi_avg is spinup.mpi_avg and gflowdist.mpi_fork is spinup.mpi_fork
    assert gflowdist.sync_params is spinup.sync_params
    assert gflowdist.dist_statistics_scalar is omnisafe.dist_statistics_scalar
    assert gflowdist.world_size is omnisafe.world_size and gflowdist.fork is omnisafe.fork
    assert gflowdist.average_across_processes is virtex.average_across_processes
    assert gflowdist.all_gather is evorl.all_gather, "top-level all_gather is EvoRL's"
    assert gflowdist.pmean is evorl.pmean and gflowdist.DP_AXIS_NAME == "DP"
    assert gflowdist.DistributedOptimizer is DistributedOptimizer
    assert gflowdist.get_rank() == virtex.get_rank() == omnisafe.get_rank()
    # the live job's size (1 alone), the same answer as every original's
    assert gflowdist.get_world_size is virtex.get_world_size
    assert gflowdist.get_world_size() == 1 == omnisafe.world_size() == spinup.num_procs()
    assert "shmap_vmap" in dir(gflowdist)


def test_clashing_names_are_not_exported():
    for name in ("broadcast", "barrier", "all_reduce", "average_gradients", "scatter"):
        assert not hasattr(gflowdist, name) or name in vars(gflowdist), name
    try:
        gflowdist.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("unknown attribute did not raise")


def test_launch_is_the_callable_launch_package():
    """``from gflowdist import launch`` gives the package gflowdist.launch, which runs VirTex's launch()."""
    import gflowdist.launch as package
    from gflowdist import launch

    assert launch is package and package.launch is virtex.launch
    seen = []
    launch(seen.append, args=("ran",))
    assert seen == ["ran"]
    assert callable(package.mpi_fork)
