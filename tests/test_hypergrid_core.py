"""Tests of the single-process HyperGrid GFlowNet core (examples/hypergrid/hypergrid_gfn.py, bare.py)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from gflowdist.errors import ConfigError, GflowdistError
from tests.support.launching import REPO
from tests.support.scripts import load_script

gfn = load_script(REPO / "examples" / "hypergrid" / "hypergrid_gfn.py")
bare = load_script(REPO / "examples" / "hypergrid" / "bare.py")

SMALL_GRIDS = [(1, 2), (1, 9), (2, 3), (2, 8), (2, 11), (3, 5), (2, 16), (3, 7)]


def scalar_reward(x: tuple[int, ...], H: int, R0=0.1, R1=0.5, R2=2.0) -> float:
    """The reward formula, one state at a time, in exact rational arithmetic."""
    a = [abs(Fraction(v, H - 1) - Fraction(1, 2)) for v in x]
    outer = all(Fraction(1, 4) < ad for ad in a)
    band = all(Fraction(3, 10) < ad < Fraction(2, 5) for ad in a)
    return R0 + R1 * outer + R2 * band


def torchgfn_style_reward(x: torch.Tensor, H: int) -> torch.Tensor:
    """torchgfn's "original" reward as it evaluates it: float32 a_d, thresholds +-1e-12."""
    a = (x / (H - 1) - 0.5).abs()
    return 0.1 + (0.25 + 1e-12 < a).prod(-1) * 0.5 + ((0.3 + 1e-12 < a) * (a < 0.4 - 1e-12)).prod(-1) * 2.0


def make(D=2, H=8, seed=0, **kw):
    torch.manual_seed(seed)
    env = gfn.HyperGrid(ndim=D, height=H)
    return env, gfn.HyperGridPolicy(env, **kw)


# --- environment -----------------------------------------------------------------------


@pytest.mark.parametrize("D,H", SMALL_GRIDS)
def test_reward_and_modes_match_a_scalar_loop(D, H):
    env = gfn.HyperGrid(ndim=D, height=H)
    xs = env.all_states()
    rewards = env.reward(xs)
    modes = gfn.modes_mask(env)
    for i, x in enumerate(itertools.product(range(H), repeat=D)):
        expected = scalar_reward(x, H)
        assert rewards[i].item() == pytest.approx(expected, abs=1e-12), x
        assert bool(modes[i]) == (expected >= 0.1 + 0.5 + 2.0 - 1e-12), x
        assert tuple(xs[i].tolist()) == x  # flat order = itertools.product order


def test_reward_matches_torchgfn_except_its_float32_boundary():
    for H in range(2, 65):
        env = gfn.HyperGrid(ndim=2, height=H)
        xs = env.all_states()
        differs = ~torch.isclose(env.reward(xs).float(), torchgfn_style_reward(xs, H))
        if (H - 1) % 10 != 0:
            assert not differs.any(), H
        else:  # float32 puts a_d = 0.9 - 0.5 just below 0.4: x_d = 0.9 (H-1) joins the band
            odd = xs[differs]
            assert ((odd == 9 * (H - 1) // 10).any(-1)).all(), H


def test_default_grid_has_four_modes_in_the_band_corners():
    env = gfn.HyperGrid()
    band = [v for v in range(8) if Fraction(3, 10) < abs(Fraction(v, 7) - Fraction(1, 2)) < Fraction(2, 5)]
    expected = {gfn.state_index(torch.tensor(x), env).item() for x in itertools.product(band, repeat=2)}
    assert set(gfn.modes_mask(env).nonzero().squeeze(-1).tolist()) == expected


@pytest.mark.parametrize("D,H", SMALL_GRIDS)
def test_true_distribution_sums_to_one_and_is_proportional_to_reward(D, H):
    env = gfn.HyperGrid(ndim=D, height=H)
    p = gfn.true_distribution(env)
    assert p.dtype == torch.float64 and p.shape == (H**D,)
    assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    r = env.reward(env.all_states())
    assert torch.allclose(p * r.sum(), r)


def test_state_index_and_unravel_are_inverse():
    env = gfn.HyperGrid(ndim=3, height=5)
    flat = torch.arange(env.n_states)
    assert torch.equal(gfn.state_index(gfn.unravel(flat, env), env), flat)
    assert gfn.state_index(torch.tensor([1, 2, 3]), env).item() == 1 * 25 + 2 * 5 + 3


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"ndim": 0}, "ndim"),
        ({"height": 1}, "height"),
        ({"R0": 0.0}, "R0"),
        ({"R2": 0.0}, "R2"),
        ({"R1": -1.0}, "R1"),
        ({"ndim": 64, "height": 2}, "height"),
    ],
)
def test_bad_environment_config_names_the_key(kwargs, key):
    with pytest.raises(ConfigError) as err:
        gfn.HyperGrid(**kwargs)
    assert err.value.key == key


# --- sampler ---------------------------------------------------------------------------


def check_valid(batch: dict, env: gfn.HyperGrid) -> None:
    """Every trajectory of the batch obeys the environment, element by element."""
    D, H, T = env.ndim, env.height, env.max_actions
    for i in range(batch["lengths"].shape[0]):
        L = batch["lengths"][i].item()
        s, a = batch["states"][i], batch["actions"][i]
        assert 1 <= L <= T
        assert s[0].tolist() == [0] * D
        for t in range(L):
            assert env.forward_mask(s[t])[a[t]].item(), (i, t)  # the action was allowed
            assert ((0 <= s[t]) & (s[t] <= H - 1)).all()
        for t in range(L - 1):  # increments: exactly one coordinate +1
            assert 0 <= a[t].item() < D
            step = s[t + 1] - s[t]
            assert step.tolist() == [int(d == a[t].item()) for d in range(D)]
        assert a[L - 1].item() == D  # ends with the stop
        assert (s[L:] == -1).all() and (a[L:] == -1).all()  # sink, then padding
        assert torch.equal(batch["terminal"][i], s[L - 1])
        assert L == batch["terminal"][i].sum().item() + 1
    assert torch.allclose(batch["log_rewards"], env.log_reward(batch["terminal"]).float())


@pytest.mark.parametrize("D,H,epsilon", [(2, 8, 0.0), (2, 8, 0.7), (3, 4, 1.0), (1, 5, 0.3)])
def test_sampled_trajectories_are_valid(D, H, epsilon):
    env, model = make(D, H)
    batch = gfn.sample_trajectories(model, env, 300, torch.Generator().manual_seed(1), epsilon)
    check_valid(batch, env)


def test_long_trajectories_reach_the_far_corner_and_are_valid():
    env, model = make(2, 5)
    with torch.no_grad():  # make stop very unlikely: trajectories run into the masks
        model.pf[-1].bias[-1] = -30.0
    batch = gfn.sample_trajectories(model, env, 50, torch.Generator().manual_seed(2))
    check_valid(batch, env)
    assert (batch["lengths"] == env.max_actions).all()
    assert (batch["terminal"] == env.height - 1).all()


def test_sampler_is_deterministic_given_a_generator():
    env, model = make()
    one = gfn.sample_trajectories(model, env, 64, torch.Generator().manual_seed(5), 0.1)
    two = gfn.sample_trajectories(model, env, 64, torch.Generator().manual_seed(5), 0.1)
    assert all(torch.equal(one[k], two[k]) for k in one)


def test_sampler_rejects_bad_arguments():
    env, model = make()
    with pytest.raises(ConfigError):
        gfn.sample_trajectories(model, gfn.HyperGrid(height=9), 4)  # not the model's env
    with pytest.raises(ConfigError):
        gfn.sample_trajectories(model, env, 0)
    with pytest.raises(ConfigError):
        gfn.sample_trajectories(model, env, 4, epsilon=1.5)


def test_batch_is_plain_tensors_with_documented_dtypes_and_shapes():
    env, model = make(3, 4)
    n, T, D = 7, env.max_actions, env.ndim
    batch = gfn.sample_trajectories(model, env, n)
    assert T == D * (env.height - 1) + 1
    expected = {
        "states": (torch.int64, (n, T + 1, D)),
        "actions": (torch.int64, (n, T)),
        "lengths": (torch.int64, (n,)),
        "log_rewards": (torch.float32, (n,)),
        "terminal": (torch.int64, (n, D)),
    }
    assert set(batch) == set(expected)
    for key, (dtype, shape) in expected.items():
        assert type(batch[key]) is torch.Tensor, key
        assert batch[key].dtype == dtype and tuple(batch[key].shape) == shape, key
        assert not batch[key].requires_grad and batch[key].is_contiguous(), key
    assert gfn.check_batch(batch, env) == n


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.pop("terminal"),
        lambda b: b.update(extra=torch.zeros(1)),
        lambda b: b.update(log_rewards=b["log_rewards"].double()),
        lambda b: b.update(actions=b["actions"][:, :-1]),
        lambda b: b.update(states=b["states"].tolist()),
    ],
)
def test_check_batch_rejects_malformed_batches(mutate):
    env, model = make()
    batch = gfn.sample_trajectories(model, env, 3)
    mutate(batch)
    with pytest.raises(GflowdistError):
        gfn.tb_loss(model, env, batch)


# --- loss ------------------------------------------------------------------------------


def naive_tb_loss(model, env, batch) -> torch.Tensor:
    """Trajectory balance one trajectory and one step at a time."""
    terms = []
    for i in range(batch["lengths"].shape[0]):
        L = batch["lengths"][i].item()
        s, a = batch["states"][i], batch["actions"][i]
        total = model.log_z - batch["log_rewards"][i]
        for t in range(L):
            total = total + model.forward_logits(s[t]).log_softmax(-1)[a[t]]
        for t in range(L - 1):
            total = total - model.backward_logits(s[t + 1]).log_softmax(-1)[a[t]]
        terms.append(total**2)
    return torch.stack(terms).mean()


@pytest.mark.parametrize("uniform_pb", [False, True])
def test_tb_loss_matches_a_per_step_loop_and_gradients_flow(uniform_pb):
    env, model = make(2, 6, uniform_pb=uniform_pb)
    batch = gfn.sample_trajectories(model, env, 40, torch.Generator().manual_seed(3), 0.5)
    loss = gfn.tb_loss(model, env, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert loss.item() == pytest.approx(naive_tb_loss(model, env, batch).item(), rel=1e-5)
    loss.backward()
    assert model.log_z.grad is not None and model.log_z.grad.abs() > 0
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert any(p.grad.abs().sum() > 0 for p in model.pf.parameters())
    if uniform_pb:
        assert model.pb is None
    else:
        assert any(p.grad.abs().sum() > 0 for p in model.pb.parameters())


def test_uniform_backward_policy_is_one_over_the_number_of_parents():
    env, model = make(3, 4, uniform_pb=True)
    batch = gfn.sample_trajectories(model, env, 30, torch.Generator().manual_seed(4), 0.5)
    _, log_pb = gfn.trajectory_log_probs(model, env, batch)
    for i in range(30):
        L = batch["lengths"][i].item()
        parents = [(batch["states"][i, t] > 0).sum().item() for t in range(1, L)]
        assert log_pb[i].item() == pytest.approx(-sum(math.log(k) for k in parents), abs=1e-5)


def test_tb_loss_scores_a_replayed_batch_with_the_current_model():
    env, model = make()
    batch = gfn.sample_trajectories(model, env, 32, torch.Generator().manual_seed(6))
    wire = {k: torch.from_numpy(v.numpy().copy()) for k, v in batch.items()}  # like a decode
    before = gfn.tb_loss(model, env, wire).item()
    assert before == pytest.approx(gfn.tb_loss(model, env, batch).item())
    with torch.no_grad():
        model.log_z += 1.0
    assert gfn.tb_loss(model, env, wire).item() != pytest.approx(before)


# --- metrics ---------------------------------------------------------------------------


def brute_force_terminal_distribution(model, env) -> dict[tuple, float]:
    """P_T by enumerating every path of a tiny grid, recursively."""
    out: dict[tuple, float] = {}

    def walk(x: tuple, prob: float) -> None:
        p = model.forward_logits(torch.tensor(x)).softmax(-1).double()
        out[x] = out.get(x, 0.0) + prob * p[env.ndim].item()
        for d in range(env.ndim):
            if x[d] < env.height - 1:
                walk((*x[:d], x[d] + 1, *x[d + 1 :]), prob * p[d].item())

    with torch.no_grad():
        walk((0,) * env.ndim, 1.0)
    return out


def test_exact_terminal_distribution_matches_path_enumeration():
    env, model = make(2, 4)
    exact = gfn.exact_terminal_distribution(model, env)
    brute = brute_force_terminal_distribution(model, env)
    for x, p in brute.items():
        assert exact[gfn.state_index(torch.tensor(x), env)].item() == pytest.approx(p, rel=1e-5)  # float32 policy
    assert exact.sum().item() == pytest.approx(1.0, abs=1e-6)


def test_sampled_frequencies_converge_to_the_exact_terminal_distribution():
    env, model = make()
    n = 20000
    batch = gfn.sample_trajectories(model, env, n, torch.Generator().manual_seed(7))
    counts = torch.bincount(gfn.state_index(batch["terminal"], env), minlength=env.n_states)
    l1 = (counts / n - gfn.exact_terminal_distribution(model, env)).abs().sum().item()
    # E|p_hat - p| <= sqrt(p/n) per state, summed <= sqrt(S/n) by Cauchy-Schwarz.
    assert l1 < 3 * math.sqrt(env.n_states / n)


def test_l1_distance_definition_and_inputs():
    env = gfn.HyperGrid()
    exact_counts = (10 * env.reward(env.all_states())).round().long()  # 1, 6, 26 per state
    assert gfn.l1_distance(exact_counts, env) == pytest.approx(0.0, abs=1e-12)
    terminals = torch.tensor([[0, 0]] * 3 + [[1, 1]])
    counts = torch.bincount(gfn.state_index(terminals, env), minlength=env.n_states)
    p = gfn.true_distribution(env)
    expected = (counts / 4 - p).abs().sum().item()
    assert gfn.l1_distance(terminals, env) == pytest.approx(expected)
    assert gfn.l1_distance(counts, env) == pytest.approx(expected)
    assert gfn.l1_distance(counts, env, "mean") == pytest.approx(expected / env.n_states)
    point = torch.zeros(env.n_states)
    point[9] = 1  # all mass on one mode: 2 * (1 - p_mode)
    assert gfn.l1_distance(point, env) == pytest.approx(2 * (1 - p[9].item()))
    with pytest.raises(GflowdistError):
        gfn.l1_distance(torch.zeros(env.n_states), env)
    with pytest.raises(GflowdistError):
        gfn.l1_distance(torch.zeros(5), env)
    with pytest.raises(ConfigError):
        gfn.l1_distance(counts, env, "max")


def test_count_modes_counts_distinct_mode_states():
    env = gfn.HyperGrid()
    modes = gfn.modes_mask(env).nonzero().squeeze(-1)
    visited = torch.cat([modes[:2], modes[:2], torch.tensor([0, 1, 63])])
    assert gfn.count_modes(visited, env) == 2
    assert gfn.count_modes(torch.arange(env.n_states), env) == int(gfn.modes_mask(env).sum())
    assert gfn.count_modes(torch.empty(0, dtype=torch.long), env) == 0


# --- training --------------------------------------------------------------------------


def test_training_reduces_l1_against_the_untrained_model():
    args = bare.Args(n_steps=300, window=1000, log_every=0, seed=0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        m = bare.train(args)
    finally:
        torch.set_num_threads(threads)
    # Exact L1 (no sampling noise) and windowed L1 both compared in the same run.
    assert m["l1_exact_final"] < 0.5 * m["l1_exact_initial"]
    assert m["l1_final"] < m["l1_initial"]
    assert 0 <= m["modes_found"] <= m["n_modes"] == 4
    assert m["trajectories"] == 300 * 16 and m["traj_per_s"] > 0


def test_bare_main_runs_with_tiny_settings(capsys):
    threads = torch.get_num_threads()  # main() pins one thread, as a script should
    m = bare.main(
        ["--n-steps", "6", "--log-every", "3", "--window", "32", "--uniform-pb", "--epsilon", "0.1", "--height", "5"]
    )
    torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "step=3" in out and "step=6" in out and "modes found" in out
    assert len(m["history"]) == 2 and m["steps"] == 6
