"""A GFlowNet on the HyperGrid, in plain vectorised torch (single process).

The pieces gflowdist's HyperGrid example and benchmarks are built from:

* ``HyperGrid``: the environment. States are integer vectors ``x`` in
  ``{0..H-1}^D``; every trajectory starts at the origin. Action ``d < D`` adds 1
  to coordinate ``d`` (masked when ``x_d == H-1``); action ``D`` stops, and
  stopping is the only way to terminate, so the terminal state is the state in
  which the stop was taken. The reward, with ``a_d = |x_d/(H-1) - 0.5|``, is::

      R(x) = R0 + R1 * prod_d 1[0.25 < a_d] + R2 * prod_d 1[0.3 < a_d < 0.4]

  evaluated exactly in integers (see ``HyperGrid.outer`` / ``HyperGrid.band``).
  A *mode* is a state with ``R(x) >= R0 + R1 + R2``, i.e. every coordinate in
  the band (the band implies the outer ring since 0.3 > 0.25).
* ``HyperGridPolicy``: an MLP forward policy ``P_F(a|s)``, a learned MLP or a
  uniform backward policy ``P_B(s|s')``, both on the one-hot (D*H) encoding of
  a state, and a learned scalar ``log_z``.
* ``sample_trajectories`` -> a batch: a dict of plain tensors (what crosses the
  wire), with ``T = env.max_actions = D*(H-1) + 1``::

      states      int64   [n, T+1, D]  s_t for t < lengths[i]; then -1 (the sink s_f, as in
                                       torchgfn, at t = lengths[i]; padding after it)
      actions     int64   [n, T]       action taken in s_t; -1 after the stop
      lengths     int64   [n]          number of actions including the stop (>= 1)
      log_rewards float32 [n]          log R(terminal)
      terminal    int64   [n, D]       s_{lengths-1}, the state in which stop was taken

* ``tb_loss``: trajectory balance, recomputing every log-probability from the
  stored states and actions with the current model (so replayed or stale
  trajectories are scored by today's policy)::

      loss = mean_i (log_z + sum_t log P_F(a_t|s_t) - log R(x_i) - sum_t log P_B(s_t|s_{t+1}))^2

  The forward sum runs over all ``lengths`` actions (stop included), the
  backward sum over the ``lengths - 1`` increments (a stop has no backward step).
* Metrics over the ``H**D`` states in flat order ``index(x) = sum_d x_d * H**(D-1-d)``
  (torchgfn's canonical order): ``true_distribution``, ``l1_distance``,
  ``modes_mask``, ``count_modes``, and ``exact_terminal_distribution`` (the
  model's exact ``P_T`` by dynamic programming, for small grids).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gflowdist.errors import ConfigError, GflowdistError

MAX_ENUMERABLE_STATES = 2**24  # true_distribution & co. allocate one entry per state
_MASKED = -1e9  # finite, so an all-masked row (e.g. P_B at the origin) never makes NaN


@dataclass(frozen=True)
class HyperGrid:
    """The HyperGrid environment: ``ndim`` (D) coordinates of side ``height`` (H)."""

    ndim: int = 2
    height: int = 8
    R0: float = 0.1
    R1: float = 0.5
    R2: float = 2.0

    def __post_init__(self) -> None:
        if self.ndim < 1:
            raise ConfigError(f"must be >= 1, got {self.ndim}", key="ndim")
        if self.height < 2:
            raise ConfigError(f"must be >= 2, got {self.height}", key="height")
        if self.height**self.ndim >= 2**63:
            raise ConfigError(f"height**ndim = {self.height}**{self.ndim} overflows int64 state indices", key="height")
        if not self.R0 > 0:
            raise ConfigError(f"must be > 0 so that log R is finite, got {self.R0}", key="R0")
        if not (self.R1 >= 0 and self.R2 > 0):
            raise ConfigError(
                f"need R1 >= 0 and R2 > 0 so that the modes (R >= R0+R1+R2) are the "
                f"band; got R1={self.R1}, R2={self.R2}",
                key="R1" if self.R2 > 0 else "R2",
            )

    @property
    def n_actions(self) -> int:
        """``D + 1``: one increment per coordinate, then stop (index ``D``)."""
        return self.ndim + 1

    @property
    def n_states(self) -> int:
        return self.height**self.ndim

    @property
    def max_actions(self) -> int:
        """``T = D*(H-1) + 1``: the longest trajectory walks to the far corner, then stops."""
        return self.ndim * (self.height - 1) + 1

    def _twice_offset(self, x: torch.Tensor) -> torch.Tensor:
        """``|2 x_d - (H-1)| = 2 (H-1) a_d``, an integer, so the thresholds are exact."""
        return (2 * x - (self.height - 1)).abs()

    def outer(self, x: torch.Tensor) -> torch.Tensor:
        """``prod_d 1[0.25 < a_d]``  <=>  ``2 |2x_d - (H-1)| > H-1`` for every d."""
        return (2 * self._twice_offset(x) > self.height - 1).all(-1)

    def band(self, x: torch.Tensor) -> torch.Tensor:
        """``prod_d 1[0.3 < a_d < 0.4]``  <=>  ``3(H-1) < 5 |2x_d - (H-1)| < 4(H-1)``."""
        k = 5 * self._twice_offset(x)
        return ((k > 3 * (self.height - 1)) & (k < 4 * (self.height - 1))).all(-1)

    def reward(self, x: torch.Tensor) -> torch.Tensor:
        """``R(x)`` in float64 for int states ``[..., D]``."""
        return self.R0 + self.R1 * self.outer(x).double() + self.R2 * self.band(x).double()

    def log_reward(self, x: torch.Tensor) -> torch.Tensor:
        return self.reward(x).log()

    def is_mode(self, x: torch.Tensor) -> torch.Tensor:
        """``R(x) >= R0 + R1 + R2``, which (R1 >= 0, R2 > 0) is exactly ``band(x)``."""
        return self.band(x)

    def forward_mask(self, x: torch.Tensor) -> torch.Tensor:
        """bool ``[..., D+1]``: increment d allowed iff ``x_d < H-1``; stop always allowed."""
        stop = torch.ones_like(x[..., :1], dtype=torch.bool)
        return torch.cat([x < self.height - 1, stop], dim=-1)

    def backward_mask(self, x: torch.Tensor) -> torch.Tensor:
        """bool ``[..., D]``: parent "x minus e_d" exists iff ``x_d > 0``."""
        return x > 0

    def all_states(self) -> torch.Tensor:
        """int64 ``[H**D, D]``: row ``i`` is the state with ``state_index == i``."""
        if self.n_states > MAX_ENUMERABLE_STATES:
            raise ConfigError(
                f"{self.height}**{self.ndim} = {self.n_states} states is too many to "
                f"enumerate (limit {MAX_ENUMERABLE_STATES})",
                key="height",
            )
        return unravel(torch.arange(self.n_states), self)


def _strides(env: HyperGrid, device: torch.device | str = "cpu") -> torch.Tensor:
    """``[H**(D-1), ..., H, 1]``: how far the flat index moves per unit of each coordinate."""
    return env.height ** torch.arange(env.ndim - 1, -1, -1, device=device)


def state_index(x: torch.Tensor, env: HyperGrid) -> torch.Tensor:
    """Flat index ``sum_d x_d * H**(D-1-d)`` (int64, shape ``x.shape[:-1]``)."""
    return (x * _strides(env, x.device)).sum(-1)


def unravel(flat: torch.Tensor, env: HyperGrid) -> torch.Tensor:
    """Inverse of ``state_index``: int64 ``[..., D]``."""
    return torch.div(flat.unsqueeze(-1), _strides(env, flat.device), rounding_mode="floor") % env.height


def _mlp(n_in: int, hidden: int, n_layers: int, n_out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(n_layers):
        layers += [nn.Linear(n_in if i == 0 else hidden, hidden), nn.ReLU()]
    layers.append(nn.Linear(hidden if n_layers else n_in, n_out))
    return nn.Sequential(*layers)


def _check_same_env(model: HyperGridPolicy, env: HyperGrid) -> None:
    if model.env != env:
        raise ConfigError(f"the model was built for {model.env}, not {env}", key="env")


class HyperGridPolicy(nn.Module):
    """``P_F`` and ``P_B`` as masked logits over one-hot states, plus ``log_z``.

    With ``uniform_pb=True`` ``P_B`` has no parameters: ``P_B(s|s') = 1/#{d: s'_d > 0}``.
    """

    def __init__(self, env: HyperGrid, hidden: int = 64, n_layers: int = 2, uniform_pb: bool = False):
        super().__init__()
        self.env = env
        n_in = env.ndim * env.height
        self.pf = _mlp(n_in, hidden, n_layers, env.n_actions)
        self.pb = None if uniform_pb else _mlp(n_in, hidden, n_layers, env.ndim)
        self.log_z = nn.Parameter(torch.zeros(()))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """float32 ``[..., D*H]``: the concatenated one-hot of each coordinate."""
        return F.one_hot(x, self.env.height).flatten(-2).float()

    def forward_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Masked ``P_F`` logits ``[..., D+1]`` (log_softmax them for log-probs)."""
        return self.pf(self.encode(x)).masked_fill(~self.env.forward_mask(x), _MASKED)

    def backward_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Masked ``P_B`` logits ``[..., D]``; entry d scores the parent ``x - e_d``."""
        if self.pb is None:
            logits = torch.zeros(x.shape, device=x.device)
        else:
            logits = self.pb(self.encode(x))
        return logits.masked_fill(~self.env.backward_mask(x), _MASKED)


@torch.no_grad()
def sample_trajectories(
    model: HyperGridPolicy, env: HyperGrid, n: int, generator: torch.Generator | None = None, epsilon: float = 0.0
) -> dict[str, torch.Tensor]:
    """Roll out ``n`` trajectories from the origin; returns the batch dict (module doc).

    Each step draws from ``(1 - epsilon) * P_F(.|s) + epsilon * Uniform(allowed actions)``.
    The loop runs over time steps (at most ``T``), never over trajectories. The batch is made
    on the model's device; a ``generator`` on another device (a CPU generator for a model on a
    GPU) draws the uniforms of an inverse-CDF sample there.
    """
    _check_same_env(model, env)
    if n < 1:
        raise ConfigError(f"must be >= 1, got {n}", key="n")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"must be in [0, 1], got {epsilon}", key="epsilon")
    T, D = env.max_actions, env.ndim
    device = model.log_z.device
    states = torch.empty((n, T + 1, D), dtype=torch.long, device=device)
    actions = torch.empty((n, T), dtype=torch.long, device=device)
    lengths = torch.zeros(n, dtype=torch.long, device=device)
    x = torch.zeros(n, D, dtype=torch.long, device=device)
    active = torch.ones(n, dtype=torch.bool, device=device)
    for t in range(T):
        states[:, t] = x
        probs = torch.softmax(model.forward_logits(x), dim=-1)
        if epsilon > 0:
            mask = env.forward_mask(x)
            probs = (1 - epsilon) * probs + epsilon * mask / mask.sum(-1, keepdim=True)
        a = _draw(probs, generator)
        a = torch.where(active, a, D)  # finished rows "stop" again, which never moves
        actions[:, t] = a
        x = x + F.one_hot(a, D + 1)[:, :D]
        lengths += active
        active &= a < D
        if not active.any():
            break
    after = torch.arange(T + 1, device=device) >= lengths.unsqueeze(1)  # the sink s_f and the padding
    states[after] = -1
    actions[after[:, :T]] = -1
    return {
        "states": states,
        "actions": actions,
        "lengths": lengths,
        "log_rewards": env.log_reward(x).float(),
        "terminal": x,
    }


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One action per row of ``probs``: ``multinomial``, or with a generator on another device the first
    index whose cumulative probability passes a uniform drawn by it."""
    if generator is None or generator.device == probs.device:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=generator.device).to(probs.device)
    cdf = probs.cumsum(-1)
    return (cdf < u * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def batch_spec(env: HyperGrid, n: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """key -> (dtype, shape) of a batch of ``n`` trajectories (see the module doc)."""
    T, D = env.max_actions, env.ndim
    return {
        "states": (torch.int64, (n, T + 1, D)),
        "actions": (torch.int64, (n, T)),
        "lengths": (torch.int64, (n,)),
        "log_rewards": (torch.float32, (n,)),
        "terminal": (torch.int64, (n, D)),
    }


#: What the runtime adds to a learner's batch from a prioritized buffer: importance weights (fresh
#: trajectories 1) and where each item came from (fresh ones -1).
REPLAY_FIELDS = {"weights": torch.float32, "keys": torch.int64}


def check_batch(batch: dict[str, torch.Tensor], env: HyperGrid) -> int:
    """Check keys, dtypes and shapes against ``batch_spec`` (not the contents); returns ``n``.

    A learner's batch may also hold :data:`REPLAY_FIELDS` (``[n]`` each).
    """
    lengths = batch.get("lengths")
    n = lengths.shape[0] if isinstance(lengths, torch.Tensor) and lengths.dim() == 1 else -1
    spec = batch_spec(env, n)
    spec.update({key: (dtype, (n,)) for key, dtype in REPLAY_FIELDS.items() if key in batch})
    if set(batch) != set(spec):
        raise GflowdistError(f"batch keys {sorted(batch)} != {sorted(spec)}")
    for key, (dtype, shape) in spec.items():
        value = batch[key]
        if not isinstance(value, torch.Tensor) or value.dtype != dtype or tuple(value.shape) != shape:
            got = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise GflowdistError(f"batch[{key!r}] must be {dtype} {shape} for D={env.ndim}, H={env.height}; got {got}")
    return n


def trajectory_log_probs(
    model: HyperGridPolicy, env: HyperGrid, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_t log P_F(a_t|s_t), sum_t log P_B(s_t|s_{t+1}))``, each float32 ``[n]``."""
    _check_same_env(model, env)
    check_batch(batch, env)
    states, actions, lengths = batch["states"], batch["actions"], batch["lengths"]
    T = env.max_actions
    t = torch.arange(T, device=lengths.device)
    forward_steps = t < lengths.unsqueeze(1)  # [n, T]: every action, stop included
    backward_steps = t < (lengths - 1).unsqueeze(1)  # [n, T]: increments only
    parents = states[:, :T].clamp(min=0)  # padding (-1) is scored, then masked out
    children = states[:, 1:].clamp(min=0)
    a = actions.clamp(min=0).unsqueeze(-1)
    log_pf = model.forward_logits(parents).log_softmax(-1).gather(-1, a).squeeze(-1)
    log_pb = (
        model.backward_logits(children).log_softmax(-1).gather(-1, a.clamp(max=env.ndim - 1)).squeeze(-1)
    )  # increment d <-> parent x - e_d
    return (torch.where(forward_steps, log_pf, 0.0).sum(1), torch.where(backward_steps, log_pb, 0.0).sum(1))


def tb_residuals(model: HyperGridPolicy, env: HyperGrid, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """float32 ``[n]``: ``log_z + log P_F(tau_i) - log R(x_i) - log P_B(tau_i)``, zero when balanced."""
    log_pf, log_pb = trajectory_log_probs(model, env, batch)
    return model.log_z + log_pf - batch["log_rewards"] - log_pb


def tb_loss(model: HyperGridPolicy, env: HyperGrid, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Trajectory balance: ``mean_i w_i (log_z + log P_F(tau_i) - log R(x_i) - log P_B(tau_i))^2``.

    ``w_i`` = ``batch["weights"]`` (a prioritized buffer's importance weights), else 1.
    """
    return weighted_square_mean(tb_residuals(model, env, batch), batch.get("weights"))


def weighted_square_mean(residuals: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``mean_i w_i r_i^2`` (``w_i`` = 1 without weights)."""
    squared = residuals.pow(2)
    return (squared if weights is None else weights * squared).mean()


def true_distribution(env: HyperGrid) -> torch.Tensor:
    """float64 ``[H**D]``: ``R(x) / Z`` with ``Z = sum_x R(x)``, in flat-index order."""
    rewards = env.reward(env.all_states())
    return rewards / rewards.sum()


def modes_mask(env: HyperGrid) -> torch.Tensor:
    """bool ``[H**D]``: which flat indices are modes (``R(x) >= R0 + R1 + R2``)."""
    return env.is_mode(env.all_states())


def count_modes(visited_flat_indices: torch.Tensor, env: HyperGrid) -> int:
    """How many *distinct* mode states appear among the visited flat indices."""
    distinct = torch.unique(visited_flat_indices.reshape(-1))
    return int(env.is_mode(unravel(distinct, env)).sum())


def l1_distance(counts_or_terminals: torch.Tensor, env: HyperGrid, reduction: str = "sum") -> float:
    """``sum_x |p_emp(x) - p_true(x)|`` over all ``H**D`` states (in [0, 2]).

    ``counts_or_terminals`` is either visit counts ``[H**D]`` or terminal states
    int64 ``[n, D]``; ``p_emp = counts / counts.sum()``. ``reduction="mean"``
    divides by ``H**D``: that is torchgfn's ``l1_dist`` (``.abs().mean()``).
    """
    x = counts_or_terminals
    if x.dim() == 2 and x.shape[1] == env.ndim and not x.is_floating_point():
        x = torch.bincount(state_index(x, env), minlength=env.n_states)
    elif x.shape != (env.n_states,):
        raise GflowdistError(
            f"expected counts [{env.n_states}] or terminal states [n, {env.ndim}] (int), got {x.dtype} {tuple(x.shape)}"
        )
    if reduction not in ("sum", "mean"):
        raise ConfigError(f"must be 'sum' or 'mean', got {reduction!r}", key="reduction")
    counts = x.double()
    if counts.sum() <= 0:
        raise GflowdistError("l1_distance needs at least one visited state")
    diff = (counts / counts.sum() - true_distribution(env)).abs()
    return float(diff.sum() if reduction == "sum" else diff.mean())


@torch.no_grad()
def exact_terminal_distribution(model: HyperGridPolicy, env: HyperGrid) -> torch.Tensor:
    """The model's exact ``P_T(x)`` (float64 ``[H**D]``, epsilon = 0), by dynamic programming.

    ``reach(origin) = 1``; ``reach(x + e_d) += reach(x) * P_F(d|x)``, level by level
    in ``sum_d x_d``; then ``P_T(x) = reach(x) * P_F(stop|x)``. Noise-free, so
    ``l1_distance``'s definition applied to it needs no samples.
    """
    _check_same_env(model, env)
    xs = env.all_states()
    p = torch.softmax(model.forward_logits(xs), dim=-1).double()
    mask = env.forward_mask(xs)
    reach = torch.zeros(env.n_states, dtype=torch.float64)
    reach[0] = 1.0
    level = xs.sum(-1)
    strides = _strides(env)
    for k in range(env.max_actions - 1):
        at = (level == k).nonzero().squeeze(-1)
        for d in range(env.ndim):
            ok = at[mask[at, d]]
            reach.index_add_(0, ok + strides[d], reach[ok] * p[ok, d])
    return reach * p[:, env.ndim]
