"""Per-actor exploration: Ape-X's fixed epsilon ladder and epsilon-greedy actions.

Ape-X (Horgan et al. 2018) gives each of ``N`` actors its own fixed epsilon::

    epsilon_i = eps ** (1 + alpha * i / (N - 1))      i = 0 .. N-1   (eps = 0.4, alpha = 7)

so actor 0 explores most (``eps``) and actor ``N-1`` least (``eps**(1+alpha)``);
a single actor gets ``eps``. Here every environment copy counts as one
actor: an actor rank with ``k`` environments owns ``k`` consecutive rungs.
"""

from __future__ import annotations

import math

import torch

from gflowdist.errors import ConfigError

__all__ = ["apex_epsilons", "epsilon_greedy"]


def apex_epsilons(first: int, count: int, total: int, eps: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """``epsilon_i`` for ``i = first .. first + count - 1`` of ``total`` (float64 tensor)."""
    if not (isinstance(eps, (int, float)) and 0.0 <= eps <= 1.0):
        raise ConfigError(f"must be in [0, 1], got {eps!r}", key="params.epsilon")
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ConfigError(f"must be a finite number >= 0, got {alpha!r}", key="params.epsilon_alpha")
    if not (0 <= first and count >= 0 and first + count <= total):
        raise ValueError(f"rungs {first}..{first + count - 1} do not fit a ladder of {total}")
    index = torch.arange(first, first + count, dtype=torch.float64)
    exponent = 1.0 + alpha * index / (total - 1) if total > 1 else torch.ones(count, dtype=torch.float64)
    return torch.tensor(float(eps), dtype=torch.float64) ** exponent


def epsilon_greedy(q_values: torch.Tensor, epsilon: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Row ``k``: a uniformly random action with probability ``epsilon[k]``, else ``argmax``."""
    greedy = q_values.argmax(dim=1)
    rows, actions = q_values.shape
    explore = torch.rand(rows, generator=generator, dtype=torch.float64) < epsilon
    random = torch.randint(0, actions, (rows,), generator=generator)
    return torch.where(explore, random, greedy)
