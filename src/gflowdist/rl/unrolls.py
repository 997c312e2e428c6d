"""Fixed-length unrolls of ``E`` environments, and how an actor picks actions with log-probabilities.

An unroll actor (:class:`~gflowdist.rl.unroll_actor.UnrollActor`) sends, per
rollout, ``E`` unrolls of ``T`` steps: one item per environment copy, each
item a row of::

    obs                float32 [T, *obs_shape]     x_t, the observation acted on
    action             int64   [T]                 a_t (Discrete)
                       float32 [T, *action_shape]  a_t (Box)
    reward             float32 [T]                 r_t
    terminated         bool    [T]                 step t reached a terminal state
    truncated          bool    [T]                 step t was cut by a time limit
    final_obs          float32 [T, *obs_shape]     the episode's final observation where step t ended it
                                                   (terminated or truncated), zeros elsewhere
    behaviour_log_prob float32 [T]                 log mu(a_t | x_t) of the policy that acted
    bootstrap_obs      float32 [*obs_shape]        x_T, the observation after the last step
    policy_version     int64   []                  the version of the weights that acted
    behaviour_logits   float32 [T, A]              (params.record_logits, Discrete only)
    behaviour_value    float32 [T]                 (params.record_values: the actor's value estimate)

After an episode ends at step ``t`` (``terminated[t] or truncated[t]``),
``obs[t + 1]`` is the first observation of the next episode. A learner
computes V-trace targets (:func:`gflowdist.rl.returns.vtrace`) from these:
``V(bootstrap_obs)`` is the bootstrap value, ``V(final_obs[t])`` the value where
``truncated[t]``.

Unrolls of one actor always have the same fields and shapes; a buffer refuses a
batch whose fields or lengths differ from what it stores, naming the sender,
the field, what it holds and what it got (``faults.on_bad_batch``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from gflowdist.rl.env_core import VectorStep

__all__ = ["UNROLL_FIELDS", "UnrollRecorder", "categorical_actions", "gaussian_actions"]

#: the fields every unroll has (``behaviour_logits`` and ``behaviour_value`` only when recorded)
UNROLL_FIELDS = (
    "obs",
    "action",
    "reward",
    "terminated",
    "truncated",
    "final_obs",
    "behaviour_log_prob",
    "bootstrap_obs",
    "policy_version",
)


def categorical_actions(logits: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Sample ``[E]`` actions from ``logits [E, A]``: ``{"action", "log_prob", "logits"}``."""
    log_probs = torch.log_softmax(logits.detach().float(), dim=-1)
    action = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(1)
    return {"action": action, "log_prob": log_probs.gather(1, action[:, None]).squeeze(1), "logits": logits.detach()}


def gaussian_actions(mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Sample ``[E, *action_shape]`` actions from a diagonal Gaussian: ``{"action", "log_prob"}``
    (the log-density summed over the action dimensions; the actions are not clipped to the space)."""
    mean, log_std = mean.detach().float(), log_std.detach().float().expand_as(mean)
    action = mean + log_std.exp() * torch.randn(mean.shape, generator=generator)
    log_prob = torch.distributions.Normal(mean, log_std.exp()).log_prob(action)
    return {"action": action, "log_prob": log_prob.reshape(mean.shape[0], -1).sum(1)}


class UnrollRecorder:
    """Collects ``T`` vector steps of ``E`` environments into ``E`` unrolls (module docstring)."""

    def __init__(
        self,
        num_envs: int,
        length: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        *,
        discrete: bool,
        num_actions: int | None = None,
        values: bool = False,
    ):
        E, T = num_envs, length
        self.length = length
        self.fields: dict[str, np.ndarray] = {
            "obs": np.zeros((E, T, *obs_shape), np.float32),
            "action": np.zeros((E, T), np.int64) if discrete else np.zeros((E, T, *action_shape), np.float32),
            "reward": np.zeros((E, T), np.float32),
            "terminated": np.zeros((E, T), bool),
            "truncated": np.zeros((E, T), bool),
            "final_obs": np.zeros((E, T, *obs_shape), np.float32),
            "behaviour_log_prob": np.zeros((E, T), np.float32),
        }
        if num_actions is not None:
            if not discrete:
                raise ValueError("behaviour logits are recorded for Discrete action spaces only")
            self.fields["behaviour_logits"] = np.zeros((E, T, num_actions), np.float32)
        if values:
            self.fields["behaviour_value"] = np.zeros((E, T), np.float32)

    def record(self, t: int, step: VectorStep, out: Mapping[str, torch.Tensor]) -> None:
        """Step ``t`` of the unroll: what the environments did and what the policy said."""
        f = self.fields
        f["obs"][:, t] = step.obs
        f["action"][:, t] = step.action
        f["reward"][:, t] = step.reward
        f["terminated"][:, t] = step.terminated
        f["truncated"][:, t] = step.truncated
        done = step.done
        f["final_obs"][:, t] = 0.0
        f["final_obs"][done, t] = step.next_obs[done]
        f["behaviour_log_prob"][:, t] = out["log_prob"].detach().cpu().numpy()
        for field, key in (("behaviour_logits", "logits"), ("behaviour_value", "value")):
            if field in f:
                if key not in out:
                    raise KeyError(f"act() must return {key!r} when {field} is recorded (params.record_{key}s)")
                f[field][:, t] = out[key].detach().cpu().float().numpy()

    def take(self, bootstrap_obs: np.ndarray, policy_version: int) -> dict[str, torch.Tensor]:
        """The ``E`` unrolls recorded so far (copies), with the bootstrap observation and version."""
        batch = {name: torch.from_numpy(values.copy()) for name, values in self.fields.items()}
        batch["bootstrap_obs"] = torch.from_numpy(np.asarray(bootstrap_obs, dtype=np.float32).copy())
        batch["policy_version"] = torch.full((bootstrap_obs.shape[0],), int(policy_version), dtype=torch.int64)
        return batch
