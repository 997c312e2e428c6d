"""gflowdist.rl.returns: GAE against a direct loop and against a case worked by hand."""

from __future__ import annotations

import pytest
import torch

from gflowdist.rl.returns import gae


def gae_reference(rewards, values, bootstrap, terminated, truncated, truncation_values, gamma, lam):
    """GAE as its definition reads: A_t = sum_k (gamma lam)^(k-t) delta_k over the steps k >= t of
    the same episode inside the unroll, one environment and one step at a time, in Python floats."""
    steps, envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * envs for _ in range(steps)]
    for e in range(envs):

        def delta(k, e=e):
            if terminated[k][e]:
                following = 0.0
            elif truncated[k][e]:
                following = truncation_values[k][e]
            elif k + 1 < steps:
                following = values[k + 1][e]
            else:
                following = bootstrap[e]
            return rewards[k][e] + gamma * following - values[k][e]

        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                total += weight * delta(k)
                if terminated[k][e] or truncated[k][e]:
                    break
                weight *= gamma * lam
            advantages[t][e] = total
    return advantages


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_the_loop_on_random_unrolls(seed):
    g = torch.Generator().manual_seed(seed)
    steps, envs = 13, 6
    rewards = torch.randn(steps, envs, generator=g, dtype=torch.float64)
    values = torch.randn(steps, envs, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(envs, generator=g, dtype=torch.float64)
    ends = torch.rand(steps, envs, generator=g) < 0.2
    cut = torch.rand(steps, envs, generator=g) < 0.5
    terminated, truncated = ends & ~cut, ends & cut
    truncation_values = torch.randn(steps, envs, generator=g, dtype=torch.float64)
    gamma, lam = 0.9 + 0.09 * float(torch.rand(1, generator=g)), float(torch.rand(1, generator=g))
    advantages, returns = gae(
        rewards,
        values,
        bootstrap,
        terminated,
        gamma=gamma,
        lam=lam,
        truncated=truncated,
        truncation_values=truncation_values,
    )
    expected = gae_reference(
        rewards.tolist(),
        values.tolist(),
        bootstrap.tolist(),
        terminated.tolist(),
        truncated.tolist(),
        truncation_values.tolist(),
        gamma,
        lam,
    )
    assert terminated.any() and truncated.any()
    torch.testing.assert_close(advantages, torch.tensor(expected, dtype=torch.float64))
    torch.testing.assert_close(returns, advantages + values)


def test_gae_worked_by_hand():
    """One environment, 4 steps, gamma = lam = 0.5: terminated after step 1, truncated after step 2
    (the cut observation is worth 8), bootstrap value 10 after step 3.

    next values: 1 (= V(s_1)), 0 (terminal), 8 (cut), 10 (bootstrap)
    deltas:      1 + .5*1 - .5 = 1,  2 + 0 - 1 = 1,  3 + .5*8 - 1.5 = 5.5,  4 + .5*10 - 2 = 7
    advantages:  A3 = 7; A2 = 5.5 (episode ends at 2); A1 = 1 (ends at 1); A0 = 1 + .25*1 = 1.25
    returns:     A + V = 1.75, 2, 7, 9
    """
    column = lambda *xs: torch.tensor(xs).reshape(-1, 1)  # noqa: E731
    advantages, returns = gae(
        column(1.0, 2.0, 3.0, 4.0),
        column(0.5, 1.0, 1.5, 2.0),
        torch.tensor([10.0]),
        column(False, True, False, False),
        gamma=0.5,
        lam=0.5,
        truncated=column(False, False, True, False),
        truncation_values=column(0.0, 0.0, 8.0, 0.0),
    )
    assert advantages.flatten().tolist() == [1.25, 1.0, 5.5, 7.0]
    assert returns.flatten().tolist() == [1.75, 2.0, 7.0, 9.0]


def test_gae_extremes_of_lambda():
    """lam = 0: one-step TD errors; lam = 1 and no ends: discounted rewards plus the discounted bootstrap."""
    rewards, values = torch.tensor([[1.0], [1.0], [1.0]]), torch.tensor([[0.0], [2.0], [4.0]])
    never = torch.zeros(3, 1, dtype=torch.bool)
    td, _ = gae(rewards, values, torch.tensor([8.0]), never, gamma=0.5, lam=0.0)
    assert td.flatten().tolist() == [1 + 0.5 * 2 - 0, 1 + 0.5 * 4 - 2, 1 + 0.5 * 8 - 4]
    _, returns = gae(rewards, values, torch.tensor([8.0]), never, gamma=0.5, lam=1.0)
    assert returns.flatten().tolist() == [1 + 0.5 + 0.25 + 0.125 * 8, 1 + 0.5 + 0.25 * 8, 1 + 0.5 * 8]


def test_gae_refuses_a_truncation_without_its_values_and_wrong_shapes():
    rewards = values = torch.zeros(3, 2)
    never = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="truncation_values"):
        gae(rewards, values, torch.zeros(2), never, gamma=0.9, lam=0.9, truncated=never)
    with pytest.raises(ValueError, match=r"bootstrap_value has shape \[3\], expected \[2\]"):
        gae(rewards, values, torch.zeros(3), never, gamma=0.9, lam=0.9)
