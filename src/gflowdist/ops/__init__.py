"""Tensor collectives, gradient/model averaging, pooled statistics and per-rank seeds, over any group.

Every operation takes ``group`` (a :class:`~gflowdist.comm.Communicator`, a
torch.distributed process group or an mpi4py communicator; None = the whole
job) and behaves as a world of one when no launcher started the process.
See docs/ops.md.
"""

from gflowdist.ops.averaging import GradientAverager, average_gradients, average_models, sync_params
from gflowdist.ops.axes import DP_AXIS_NAME, POP_AXIS_NAME, axis_group, bind_axis, unbind_axis
from gflowdist.ops.buckets import broadcast_tensors, plan_buckets, reduce_tensors
from gflowdist.ops.collectives import (
    all_gather,
    as_reduce_op,
    avg_tensor,
    barrier,
    broadcast,
    dist_avg,
    dist_max,
    dist_min,
    dist_op,
    dist_sum,
    gather_distributed_data,
    group_or_world,
)
from gflowdist.ops.optimizer import DistributedOptimizer
from gflowdist.ops.seeds import rank_seed, rank_seeds, seed_rank
from gflowdist.ops.statistics import statistics_scalar

__all__ = [
    "GradientAverager",
    "average_gradients",
    "average_models",
    "sync_params",
    "DP_AXIS_NAME",
    "POP_AXIS_NAME",
    "axis_group",
    "bind_axis",
    "unbind_axis",
    "broadcast_tensors",
    "plan_buckets",
    "reduce_tensors",
    "all_gather",
    "as_reduce_op",
    "avg_tensor",
    "barrier",
    "broadcast",
    "dist_avg",
    "dist_max",
    "dist_min",
    "dist_op",
    "dist_sum",
    "gather_distributed_data",
    "group_or_world",
    "DistributedOptimizer",
    "rank_seed",
    "rank_seeds",
    "seed_rank",
    "statistics_scalar",
]
