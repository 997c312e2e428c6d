"""Reinforcement learning on the role runtime: environment actors, transitions, unrolls, returns.

- :class:`VectorEnvActor` (:mod:`gflowdist.rl.env_core`) is the environment-stepping core
  every environment actor shares: a gymnasium vector environment (extra ``rl``:
  ``pip install 'gflowdist[rl]'``), episodes kept running across rollouts, episode
  returns as metrics.
- :class:`EnvironmentActor` emits n-step transitions (Ape-X, DQN; discrete actions);
  :class:`NStepTransitions` accumulates them.
- :class:`UnrollActor` emits fixed-length unrolls with the behaviour policy's
  log-probabilities (IMPALA, APPO; discrete and continuous actions), fields in
  :mod:`gflowdist.rl.unrolls`; :func:`categorical_actions` and :func:`gaussian_actions`
  pick actions with their log-probabilities.
- :func:`apex_epsilons` is Ape-X's per-actor epsilon ladder; :func:`epsilon_greedy`
  picks actions with it.
- :func:`gae` and :func:`vtrace` (:mod:`gflowdist.rl.returns`): advantages and value
  targets of time-major unrolls (PPO, A2C; IMPALA, APPO).

See docs/rl.md, examples/apex_cartpole/ and examples/impala_cartpole/.
"""

from __future__ import annotations

from gflowdist.rl.env_actor import EnvironmentActor
from gflowdist.rl.env_core import VectorEnvActor, VectorStep, make_vector_env
from gflowdist.rl.exploration import apex_epsilons, epsilon_greedy
from gflowdist.rl.returns import VTrace, gae, vtrace
from gflowdist.rl.transitions import TRANSITION_FIELDS, NStepTransitions
from gflowdist.rl.unroll_actor import UnrollActor
from gflowdist.rl.unrolls import UNROLL_FIELDS, UnrollRecorder, categorical_actions, gaussian_actions

__all__ = [
    "EnvironmentActor",
    "NStepTransitions",
    "TRANSITION_FIELDS",
    "UNROLL_FIELDS",
    "UnrollActor",
    "UnrollRecorder",
    "VTrace",
    "VectorEnvActor",
    "VectorStep",
    "apex_epsilons",
    "categorical_actions",
    "epsilon_greedy",
    "gae",
    "gaussian_actions",
    "make_vector_env",
    "vtrace",
]
