"""torchgfn ``Trajectories`` <-> the plain-tensor batch gflowdist sends over the wire.

torchgfn keeps a batch of trajectories in a ``Trajectories`` container: a
``States`` object and an ``Actions`` object, both *time first*, plus
``terminating_idx``, the cached log rewards and a reference to the
environment. Its own remote replay buffer pickles that whole object with dill
(``gfn.containers.message.Message.serialize``). gflowdist sends only plain
tensors (msgpack envelope + raw frames, nothing pickled), *batch first*, all
of one fixed length so that fresh and replayed batches concatenate along
dimension 0. With ``n`` trajectories, ``T = max_length`` actions at most, a
state shape ``S`` (``(D,)`` on a D-dimensional HyperGrid) and an action shape
``A`` (``(1,)`` for discrete environments)::

    states           [n, T+1, *S]  s_t for t < L_i, then env.sf (the sink) from t = L_i on
    actions          [n, T,   *A]  a_t for t < L_i (a_{L_i - 1} is the exit action),
                                   then env.dummy_action
    terminating_idx  int64 [n]     L_i, the number of actions including the exit (>= 1)
    log_rewards      float [n]     log R(s_{L_i - 1})
    terminal         [n, *S]       s_{L_i - 1}, the state in which the exit was taken

``states`` and ``actions`` are torchgfn's ``states.tensor`` / ``actions.tensor``
transposed to batch first and padded from torchgfn's per-batch length
(``trajectories.max_length``, the longest trajectory in *this* batch) up to
``T`` with the same fill torchgfn pads with (``sf`` and ``dummy_action``), so
the padding is invisible to its losses: they mask steps where
``states.is_sink_state`` / ``actions.is_dummy``.

:func:`batch_to_trajectories` transposes back and rebuilds a ``Trajectories``
bound to the receiving rank's own environment object. Log-probabilities and
estimator outputs are *not* carried: a replayed trajectory was sampled by an
older policy (possibly on another rank), so the loss recomputes them with the
current model (``gflownet.loss(env, trajectories)``, whose
``recalculate_all_logprobs`` defaults to True).

Only non-graph, unconditional, forward trajectories are converted; anything
else raises a :class:`~gflowdist.errors.GflowdistError` saying what it got.
"""

from __future__ import annotations

import torch
from gfn.containers import Trajectories
from gfn.env import Env
from gfn.states import GraphStates

from gflowdist.errors import GflowdistError

__all__ = ["BATCH_KEYS", "trajectories_to_batch", "batch_to_trajectories", "check_batch"]

#: the fields of a wire batch (module docstring)
BATCH_KEYS = ("states", "actions", "terminating_idx", "log_rewards", "terminal")


def _pad_time(tensor: torch.Tensor, length: int, fill: torch.Tensor) -> torch.Tensor:
    """``tensor`` (time first) extended to ``length`` steps with copies of ``fill``."""
    missing = length - tensor.shape[0]
    pad = fill.to(tensor.dtype).expand(missing, tensor.shape[1], *fill.shape)
    return torch.cat([tensor, pad])


def trajectories_to_batch(trajectories: Trajectories, max_length: int) -> dict[str, torch.Tensor]:
    """The wire batch of ``trajectories`` (module docstring), padded to ``max_length`` actions.

    ``max_length`` is the longest trajectory the environment allows (on a
    HyperGrid ``D*(H-1) + 1``); a batch holding a longer one is refused.
    """
    env = trajectories.env
    if isinstance(trajectories.states, GraphStates):
        raise GflowdistError(
            "graph trajectories (GraphStates) have no fixed-shape tensor form; only tensor States are carried"
        )
    if trajectories.is_backward:
        raise GflowdistError("backward trajectories are not carried; sample forward trajectories")
    if trajectories.states.conditions is not None:
        raise GflowdistError("conditional trajectories (states.conditions) are not carried")
    if trajectories.max_length > max_length:
        raise GflowdistError(
            f"a trajectory of {trajectories.max_length} actions is longer than "
            f"max_length={max_length}; raise max_length to the environment's limit"
        )
    states = _pad_time(trajectories.states.tensor, max_length + 1, env.sf)
    actions = _pad_time(trajectories.actions.tensor, max_length, env.dummy_action)
    log_rewards = trajectories.log_rewards
    if log_rewards is None:  # only backward trajectories have none, refused above
        raise GflowdistError("trajectories without log rewards cannot be sent")
    return {
        "states": states.transpose(0, 1).contiguous(),
        "actions": actions.transpose(0, 1).contiguous(),
        "terminating_idx": trajectories.terminating_idx.to(torch.int64).clone(),
        "log_rewards": log_rewards.detach().clone(),
        "terminal": trajectories.terminating_states.tensor.clone(),
    }


def check_batch(env: Env, batch: dict[str, torch.Tensor]) -> int:
    """Check a wire batch's keys, shapes and lengths against ``env``; returns ``n``.

    The receiving side calls this before handing tensors to torchgfn, whose
    own checks are ``assert`` statements (gone under ``python -O``).
    """
    if set(batch) != set(BATCH_KEYS):
        raise GflowdistError(f"a torchgfn wire batch has keys {sorted(BATCH_KEYS)}, got {sorted(batch)}")
    if not all(isinstance(batch[key], torch.Tensor) for key in BATCH_KEYS):
        kinds = {key: type(batch[key]).__name__ for key in BATCH_KEYS}
        raise GflowdistError(f"every field of a torchgfn wire batch is a tensor, got {kinds}")
    states, lengths = batch["states"], batch["terminating_idx"]
    state_shape, action_shape = tuple(env.state_shape), tuple(env.action_shape)
    n = lengths.shape[0] if lengths.dim() == 1 else -1
    if n < 0 or states.dim() != 2 + len(state_shape) or tuple(states.shape[2:]) != state_shape:
        raise GflowdistError(
            f"states must be [n, T+1, *{state_shape}] and terminating_idx [n]; got "
            f"{tuple(states.shape)} and {tuple(lengths.shape)}"
        )
    T = states.shape[1] - 1
    expected = {
        "states": (n, T + 1, *state_shape),
        "actions": (n, T, *action_shape),
        "terminating_idx": (n,),
        "log_rewards": (n,),
        "terminal": (n, *state_shape),
    }
    for key, shape in expected.items():
        if tuple(batch[key].shape) != shape:
            raise GflowdistError(
                f"batch[{key!r}] must have shape {shape} (n={n}, T={T}), got {tuple(batch[key].shape)}"
            )
    if lengths.is_floating_point() or not batch["log_rewards"].is_floating_point():
        raise GflowdistError(
            f"terminating_idx must be integer and log_rewards floating point; got "
            f"{lengths.dtype} and {batch['log_rewards'].dtype}"
        )
    if n and not bool(((lengths >= 1) & (lengths <= T)).all()):
        raise GflowdistError(
            f"terminating_idx must lie in [1, T={T}], got values from {int(lengths.min())} to {int(lengths.max())}"
        )
    return n


def batch_to_trajectories(env: Env, batch: dict[str, torch.Tensor]) -> Trajectories:
    """A torchgfn ``Trajectories`` on ``env`` from a wire batch (fresh, replayed or both)."""
    check_batch(env, batch)
    states = env.states_from_tensor(batch["states"].transpose(0, 1))
    actions = env.actions_from_tensor(batch["actions"].transpose(0, 1))
    return Trajectories(
        env, states=states, actions=actions, terminating_idx=batch["terminating_idx"], log_rewards=batch["log_rewards"]
    )
