"""gflowdist.rl.returns.vtrace against the paper's sum written as plain loops, and one case worked by hand.

The cases are written batch-first (a row per unroll, as unrolls come from a buffer) and passed
time-major (``.T``), as vtrace takes them."""

from __future__ import annotations

import math

import pytest
import torch

from gflowdist.rl.returns import vtrace


def reference(mu, pi, r, v, boot, term, trunc, tv, gamma, rho_bar, c_bar, pg_rho_bar, lam):
    """Espeholt et al. eq. 1 as a sum, one unroll and one step at a time, in Python floats:

    v_s = V(x_s) + sum_{t=s}^{end} gamma^(t-s) (prod_{i=s}^{t-1} c_i) delta_t, the sum stopping at the
    episode's end or the unroll's; the next value after a step is 0 (terminated), V(final) (truncated),
    V(x_{t+1}) or the bootstrap value (after the last step).
    """
    B, T = len(r), len(r[0])
    vs = [[0.0] * T for _ in range(B)]
    adv = [[0.0] * T for _ in range(B)]
    for b in range(B):

        def after(t, values, b=b):
            if term[b][t]:
                return 0.0
            if trunc[b][t]:
                return tv[b][t]
            return values[t + 1] if t + 1 < T else boot[b]

        ratio = [math.exp(pi[b][t] - mu[b][t]) for t in range(T)]
        delta = [min(rho_bar, ratio[t]) * (r[b][t] + gamma * after(t, v[b]) - v[b][t]) for t in range(T)]
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * delta[t]
                if term[b][t] or trunc[b][t]:
                    break
                weight *= gamma * lam * min(c_bar, ratio[t])
            vs[b][s] = v[b][s] + total
        for s in range(T):
            adv[b][s] = min(pg_rho_bar, ratio[s]) * (r[b][s] + gamma * after(s, vs[b]) - v[b][s])
    return torch.tensor(vs), torch.tensor(adv)


@pytest.mark.parametrize("seed", range(6))
def test_vtrace_matches_the_loop_reference_on_random_unrolls(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 9
    mu = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    pi = mu + torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios from ~0.1 to ~10: clipping bites
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    boot = torch.randn(B, generator=g, dtype=torch.float64)
    ends = torch.rand(B, T, generator=g)
    term, trunc = ends < 0.15, (ends >= 0.15) & (ends < 0.3)
    tv = torch.randn(B, T, generator=g, dtype=torch.float64)
    gamma, rho_bar, c_bar, pg_rho_bar, lam = 0.9, 1.0 + seed / 4, 0.5 + seed / 6, 1.2, 0.95 if seed % 2 else 1.0
    out = vtrace(
        mu.T, pi.T, r.T, v.T, boot, term.T, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lam=lam,
        truncated=trunc.T, truncation_values=tv.T,
    )  # fmt: skip
    want_vs, want_adv = reference(
        mu.tolist(), pi.tolist(), r.tolist(), v.tolist(), boot.tolist(), term.tolist(), trunc.tolist(), tv.tolist(),
        gamma, rho_bar, c_bar, pg_rho_bar, lam,
    )  # fmt: skip
    assert bool(term.any()) and bool(trunc.any())
    torch.testing.assert_close(out.vs.T, want_vs.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.advantages.T, want_adv.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.rhos.T, torch.exp(pi - mu).clamp(max=rho_bar).float())


def test_vtrace_by_hand_with_clipping_a_truncation_and_a_termination():
    """gamma 0.5, rho_bar 1, c_bar 0.8.

    Row 0: ratios 2, 0.5, 1.5 -> rho 1, 0.5, 1 and c 0.8, 0.5, 0.8; rewards 1, 2, 3; V = 1, 1, 1;
    step 1 truncated with V(final) = 2; bootstrap 4.
      delta = 1*(1 + .5*1 - 1) = .5,  .5*(2 + .5*2 - 1) = 1,  1*(3 + .5*4 - 1) = 4
      v_2 = 1 + 4 = 5;  v_1 = 1 + 1 = 2 (the episode ended: no trace from step 2);  v_0 = 1 + .5 + .5*.8*1 = 1.9
      adv = 1*(1 + .5*v_1 - 1) = 1,  .5*(2 + .5*2 - 1) = 1,  1*(3 + .5*4 - 1) = 4
    Row 1: on-policy (ratios 1, c 0.8); rewards 1; V = .5; step 0 terminated; bootstrap 1.
      delta = 1 + 0 - .5 = .5,  1 + .5*.5 - .5 = .75,  1 + .5*1 - .5 = 1
      v_2 = 1.5;  v_1 = .5 + .75 + .5*.8*1 = 1.65;  v_0 = .5 + .5 = 1 (terminal: nothing after)
      adv = 1 + 0 - .5 = .5,  1 + .5*v_2 - .5 = 1.25,  1 + .5*1 - .5 = 1
    """
    mu = torch.zeros(2, 3)
    pi = torch.log(torch.tensor([[2.0, 0.5, 1.5], [1.0, 1.0, 1.0]]))
    r = torch.tensor([[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    v = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])
    boot = torch.tensor([4.0, 1.0])
    term = torch.tensor([[False, False, False], [True, False, False]])
    trunc = torch.tensor([[False, True, False], [False, False, False]])
    tv = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    out = vtrace(
        mu.T, pi.T, r.T, v.T, boot, term.T, gamma=0.5, rho_bar=1.0, c_bar=0.8, truncated=trunc.T, truncation_values=tv.T
    )
    torch.testing.assert_close(out.vs.T, torch.tensor([[1.9, 2.0, 5.0], [1.0, 1.65, 1.5]]))
    torch.testing.assert_close(out.advantages.T, torch.tensor([[1.0, 1.0, 4.0], [0.5, 1.25, 1.0]]))
    torch.testing.assert_close(out.rhos.T, torch.tensor([[1.0, 0.5, 1.0], [1.0, 1.0, 1.0]]))


def test_on_policy_vtrace_is_the_bootstrapped_discounted_return():
    z = torch.zeros(4, 1)
    out = vtrace(z, z, torch.ones(4, 1), z, torch.tensor([10.0]), z.bool(), gamma=0.9)
    want = [1 + 0.9 + 0.81 + 0.729 + 0.6561 * 10, 1 + 0.9 + 0.81 + 0.729 * 10, 1 + 0.9 + 0.81 * 10, 1 + 0.9 * 10]
    torch.testing.assert_close(out.vs, torch.tensor(want)[:, None])


def test_vtrace_refuses_a_truncation_without_its_value_and_mismatched_shapes():
    z = torch.zeros(3, 2)  # T = 3 steps of B = 2
    trunc = torch.zeros(3, 2, dtype=torch.bool)
    trunc[1, 0] = True
    with pytest.raises(ValueError, match="truncated is given without truncation_values"):
        vtrace(z, z, z, z, torch.zeros(2), torch.zeros_like(trunc), gamma=0.9, truncated=trunc)
    with pytest.raises(ValueError, match=r"rewards has shape \[3, 4\], expected \[3, 2\]"):
        vtrace(z, z, torch.zeros(3, 4), z, torch.zeros(2), trunc, gamma=0.9)
    with pytest.raises(ValueError, match="bootstrap_value has shape"):
        vtrace(z, z, z, z, torch.zeros(3), trunc, gamma=0.9)
