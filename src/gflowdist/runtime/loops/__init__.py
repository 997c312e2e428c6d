"""Every role's loop, one module each; each loop is a short sequence of named steps.

| loop | its steps |
|---|---|
| :func:`trainer.run_trainer` | rollout, ship, replayed, learn, sync, publish, checkpoint, keep alive |
| :func:`actor.run_actor` | read my trainer's messages, apply weights, checkpoint cuts, rollout, ship |
| :func:`buffer.run_buffer` | admit, serve samples, save complete checkpoint cuts; idle: summaries, back off |
| :func:`coordinator.run_coordinator` | hear everyone, decide to stop, print progress |

What trainers and actors do alike (ship trajectories, cut a checkpoint, finish)
is in :mod:`gflowdist.runtime.loops.client`; an agent group's averaging in
:mod:`gflowdist.runtime.loops.agent_group`. The messages they exchange are in
:mod:`gflowdist.runtime.protocol`.
"""

from gflowdist.runtime.loops.actor import run_actor
from gflowdist.runtime.loops.buffer import run_buffer
from gflowdist.runtime.loops.client import concat_batches, trajectory_count
from gflowdist.runtime.loops.coordinator import run_coordinator
from gflowdist.runtime.loops.trainer import run_trainer

__all__ = ["run_trainer", "run_actor", "run_buffer", "run_coordinator", "concat_batches", "trajectory_count"]
