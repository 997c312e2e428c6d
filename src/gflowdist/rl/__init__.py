"""Reinforcement learning on the role runtime: environment actors, n-step transitions, exploration.

- :class:`EnvironmentActor` steps a gymnasium vector environment (extra ``rl``:
  ``pip install 'gflowdist[rl]'``), keeps episodes running across rollouts and
  emits n-step transitions; episode returns are its metrics.
- :class:`NStepTransitions` accumulates the transitions of ``E`` environments.
- :func:`apex_epsilons` is Ape-X's per-actor epsilon ladder; :func:`epsilon_greedy`
  picks actions with it.
- :func:`gae` (:mod:`gflowdist.rl.returns`): advantages and value targets of
  time-major unrolls (PPO, A2C).

See docs/rl.md and examples/apex_cartpole/.
"""

from __future__ import annotations

from gflowdist.rl.env_actor import EnvironmentActor, make_vector_env
from gflowdist.rl.exploration import apex_epsilons, epsilon_greedy
from gflowdist.rl.returns import gae
from gflowdist.rl.transitions import TRANSITION_FIELDS, NStepTransitions

__all__ = [
    "EnvironmentActor",
    "NStepTransitions",
    "TRANSITION_FIELDS",
    "apex_epsilons",
    "epsilon_greedy",
    "gae",
    "make_vector_env",
]
