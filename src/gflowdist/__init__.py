"""gflowdist: asynchronous actor / learner / replay-buffer training on MPI and torch.distributed."""

from gflowdist.errors import (
    ConfigError as ConfigError,
)
from gflowdist.errors import (
    DeadlineError as DeadlineError,
)
from gflowdist.errors import (
    GflowdistError as GflowdistError,
)
from gflowdist.errors import (
    LayoutError as LayoutError,
)
from gflowdist.errors import (
    LedgerError as LedgerError,
)
from gflowdist.errors import (
    PeerLostError as PeerLostError,
)
from gflowdist.errors import (
    ProtocolError as ProtocolError,
)
from gflowdist.errors import (
    TransportError as TransportError,
)

__version__ = "0.1.0"


# --- compat re-exports (owned by ops/compat) ---
# The original libraries' helpers whose names clash with no other original
# (see docs/migration.md), plus DistributedOptimizer. Imported on first
# access (PEP 562), so `import gflowdist` stays light: no torch, no mpi4py.
# VirTex's `launch` is the subpackage gflowdist.launch, which is callable.
_COMPAT_SPINUP = (
    "proc_id",
    "num_procs",
    "msg",
    "allreduce",
    "mpi_op",
    "mpi_sum",
    "mpi_avg",
    "mpi_statistics_scalar",
    "mpi_fork",
    "setup_pytorch_for_mpi",
    "mpi_avg_grads",
    "sync_params",
)
_COMPAT_OMNISAFE = (
    "setup_distributed",
    "get_rank",
    "world_size",
    "is_master",
    "fork",
    "dist_op",
    "dist_sum",
    "dist_max",
    "dist_min",
    "dist_avg",
    "avg_tensor",
    "avg_grads",
    "avg_params",
    "dist_statistics_scalar",
)
_COMPAT_VIRTEX = (
    "launch",
    "synchronize",
    "get_world_size",
    "is_master_process",
    "average_across_processes",
    "gpu_mem_usage",
)
_COMPAT_EVORL = (
    "DP_AXIS_NAME",
    "POP_AXIS_NAME",
    "pmean",
    "psum",
    "pmax",
    "pmin",
    "all_gather",
    "get_process_id",
    "get_global_ranks",
    "is_dist_initialized",
    "split_key_to_devices",
    "tree_device_put",
    "gradient_update",
    "agent_gradient_update",
    "shmap_map",
    "shmap_vmap",
)
_COMPAT_EXPORTS = {
    **{name: "gflowdist.compat.spinup" for name in _COMPAT_SPINUP},
    **{name: "gflowdist.compat.omnisafe" for name in _COMPAT_OMNISAFE},
    **{name: "gflowdist.compat.virtex" for name in _COMPAT_VIRTEX},
    **{name: "gflowdist.compat.evorl" for name in _COMPAT_EVORL},
    "DistributedOptimizer": "gflowdist.ops.optimizer",
    # the core, for `from gflowdist import Trainer, BufferManager`
    **{name: "gflowdist.runtime.roles" for name in ("Actor", "Trainer", "BufferManager", "Coordinator")},
    "DistributedContext": "gflowdist.context",
    "Config": "gflowdist.config",
    "ReplayBuffer": "gflowdist.replay",
    "world_comm": "gflowdist.comm",
    "ReduceOp": "gflowdist.comm",
}


def __getattr__(name: str):
    module = _COMPAT_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gflowdist' has no attribute {name!r}")
    import importlib

    if name == "launch":  # VirTex's launch() is the package gflowdist.launch itself, callable
        return importlib.import_module("gflowdist.launch")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_COMPAT_EXPORTS))
