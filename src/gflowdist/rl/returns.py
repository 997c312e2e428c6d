"""Returns and advantages of fixed-length unrolls: GAE (PPO, A2C) and V-trace (IMPALA, APPO).

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

Unrolls from a buffer (:mod:`gflowdist.rl.unrolls`) are batch-first ``[B, T]``:
pass ``tensor.T`` (or ``movedim(1, 0)``).

**V-trace** (Espeholt et al. 2018, eq. 1 and section 4.2). With the
importance ratios ``pi(a_t|s_t) / mu(a_t|s_t)`` of the learner's policy ``pi``
against the behaviour policy ``mu`` that acted, and ``V'_{t+1}`` the value that
follows step ``t`` (above)::

    rho_t = min(rho_bar, ratio_t)          c_t = lam * min(c_bar, ratio_t)
    delta_t = rho_t * (r_t + gamma * V'_{t+1} - V(s_t))
    v_t = V(s_t) + delta_t + gamma * c_t * (1 - done_t) * (v_{t+1} - V(s_{t+1}))     (v_T = bootstrap_value)
    advantage_t = pg_rho_t * (r_t + gamma * v'_{t+1} - V(s_t))      pg_rho_t = min(pg_rho_bar, ratio_t)

where ``v'_{t+1}`` follows step ``t`` as ``V'`` does, with ``v_{t+1}`` in place of
``V(s_{t+1})`` inside the unroll (0 after a terminal state, the truncation value
after a cut, ``bootstrap_value`` after the last step). With ``rho_bar = c_bar = 1``
and on-policy data the targets are the n-step returns bootstrapped at the unroll's end.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["gae", "vtrace", "VTrace", "next_values"]


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


class VTrace(NamedTuple):
    """What :func:`vtrace` returns, each ``[T, *B]``."""

    vs: torch.Tensor  #: value targets ``v_t``
    advantages: torch.Tensor  #: policy-gradient advantages (with ``pg_rho_t``)
    rhos: torch.Tensor  #: the clipped importance weights ``rho_t``


def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    lam: float = 1.0,
    truncated: torch.Tensor | None = None,
    truncation_values: torch.Tensor | None = None,
) -> VTrace:
    """V-trace targets and advantages (module docstring) of time-major unrolls ``[T, *B]``.

    ``behaviour_log_probs`` are ``log mu(a_t|s_t)`` the actors recorded,
    ``target_log_probs`` ``log pi(a_t|s_t)`` under the learner's policy; ``rho_bar``
    and ``c_bar`` clip the importance ratios (``rho_bar >= c_bar`` in the paper),
    ``pg_rho_bar`` the advantage's (default ``rho_bar``), ``lam`` is the trace's lambda.
    Computed without gradients.
    """
    _check_shapes("rewards", rewards, values.shape)
    _check_shapes("behaviour_log_probs", behaviour_log_probs, values.shape)
    _check_shapes("target_log_probs", target_log_probs, values.shape)
    with torch.no_grad():
        values, bootstrap_value = values.detach().float(), bootstrap_value.detach().float()
        if truncation_values is not None:
            truncation_values = truncation_values.detach().float()
        following = next_values(values, bootstrap_value, terminated, truncated, truncation_values)
        done = terminated.bool() if truncated is None else terminated.bool() | truncated.bool()
        ratio = torch.exp(target_log_probs.detach().float() - behaviour_log_probs.detach().float())
        rhos = ratio.clamp(max=rho_bar)
        carry = gamma * lam * ratio.clamp(max=c_bar) * (~done).float()
        deltas = rhos * (rewards.float() + gamma * following - values)
        corrections = torch.empty_like(values)
        running = torch.zeros_like(values[0])
        for t in range(values.shape[0] - 1, -1, -1):
            running = deltas[t] + carry[t] * running
            corrections[t] = running
        vs = values + corrections
        following_vs = next_values(vs, bootstrap_value, terminated, truncated, truncation_values)
        pg_rhos = ratio.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
        return VTrace(vs, pg_rhos * (rewards.float() + gamma * following_vs - values), rhos)
