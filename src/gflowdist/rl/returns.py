"""Returns and advantages of fixed-length unrolls: GAE (PPO, A2C).

Every function takes **time-major** tensors ``[T, *B]`` (``T`` steps of any batch
shape ``B``, e.g. ``E`` environment copies): step ``t`` saw ``s_t``, took ``a_t``,
got ``r_t`` and ended the episode there when ``terminated[t]`` (a terminal state:
nothing follows) or ``truncated[t]`` (cut by a time limit: the episode would have
gone on). Episodes run on across unrolls; the step after a terminated or truncated
one belongs to a new episode (gymnasium's same-step autoreset), so nothing flows
across that boundary.

The value that follows step ``t``:

- ``0`` when ``terminated[t]``;
- ``truncation_values[t]`` (the value of the observation the episode was cut at,
  gymnasium's ``info["final_obs"]``) when ``truncated[t]``;
- ``values[t + 1]`` inside the unroll, and ``bootstrap_value`` (the value of the
  observation after the last step) at ``t = T - 1``.
"""

from __future__ import annotations

import torch

__all__ = ["gae"]


def _check_shapes(name: str, got: torch.Tensor, expected: torch.Size) -> None:
    if got.shape != expected:
        raise ValueError(f"{name} has shape {list(got.shape)}, expected {list(expected)} (time-major [T, *B])")


def next_values(
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor | None = None,
    truncation_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[T, *B]``: the value that follows each step (see the module docstring)."""
    shape = values.shape
    _check_shapes("terminated", terminated, shape)
    _check_shapes("bootstrap_value", bootstrap_value, shape[1:])
    following = torch.cat([values[1:], bootstrap_value.unsqueeze(0).to(values.dtype)], dim=0)
    if truncated is not None:
        _check_shapes("truncated", truncated, shape)
        if truncation_values is None:
            raise ValueError(
                "truncated is given without truncation_values: a truncated step bootstraps from the value of "
                "the observation it was cut at (info['final_obs']); pass truncation_values [T, *B]"
            )
        _check_shapes("truncation_values", truncation_values, shape)
        following = torch.where(truncated.bool(), truncation_values.to(values.dtype), following)
    return torch.where(terminated.bool(), torch.zeros_like(following), following)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    truncated: torch.Tensor | None = None,
    truncation_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016): ``(advantages, returns)``, each ``[T, *B]``.

    ``delta_t = r_t + gamma * next_value_t - values[t]`` and
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` (``done``: terminated or
    truncated; ``A_T = 0``); ``returns = advantages + values`` are the value targets
    (lambda-returns). ``lam = 1`` gives Monte-Carlo advantages bootstrapped at the
    unroll's end, ``lam = 0`` one-step TD errors.

    ``rewards``, ``values``, ``terminated`` (and ``truncated``, ``truncation_values``
    when episodes can be cut by a time limit) are ``[T, *B]``; ``bootstrap_value`` is
    ``[*B]``. Computed without gradients (targets, not part of the graph).
    """
    _check_shapes("rewards", rewards, values.shape)
    with torch.no_grad():
        following = next_values(values, bootstrap_value, terminated, truncated, truncation_values)
        values = values.detach()
        done = terminated.bool() if truncated is None else terminated.bool() | truncated.bool()
        deltas = rewards.to(values.dtype) + gamma * following - values
        carry = (gamma * lam) * (~done).to(values.dtype)
        advantages = torch.empty_like(values)
        running = torch.zeros_like(values[0])
        for t in range(values.shape[0] - 1, -1, -1):
            running = deltas[t] + carry[t] * running
            advantages[t] = running
        return advantages, advantages + values
