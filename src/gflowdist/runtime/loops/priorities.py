"""Prioritized replay across ranks: what the loops add to their messages and do with them.

1. A producer's :meth:`~gflowdist.runtime.roles.Actor.initial_priorities` travel
   with its trajectories (:func:`initial_priorities`); the buffer admits the
   items with them (``ReplayBuffer.extend(..., priorities=)``).
2. A prioritized buffer answers a sample request with each item's
   importance weight and key, beta taken at the learner step that will use them
   (:func:`sample_reply_for`); the trainer's batch gets them as
   ``batch["weights"]`` and ``batch["keys"]`` (:func:`replayed_batch`).
3. After the optimizer step the trainer's
   :meth:`~gflowdist.runtime.roles.Trainer.priorities` of the replayed items go
   back with their keys (:func:`priority_update`), sent without waiting; the
   buffer applies them to the items still stored and counts the rest as stale
   (:func:`apply_priority_update`, :meth:`ReplayBuffer.update_priorities`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.errors import GflowdistError
from gflowdist.replay import ReplayBuffer
from gflowdist.runtime import protocol
from gflowdist.runtime.protocol import Outgoing
from gflowdist.runtime.roles import Actor, Trainer

__all__ = ["initial_priorities", "sample_reply_for", "replayed_batch", "priority_update", "apply_priority_update"]


def _checked(values: Any, count: int, source: str) -> torch.Tensor:
    checked = torch.as_tensor(values).detach().flatten().to("cpu", torch.float32)
    if checked.numel() != count:
        raise GflowdistError(f"{source} returned {checked.numel()} priorities for a batch of {count}")
    return checked


def initial_priorities(producer: Actor, batch: dict[str, torch.Tensor], n: int) -> torch.Tensor | None:
    """``producer.initial_priorities(batch)`` as ``n`` float32 values on the host, or None.

    None also for an actor whose policy runs on an inference rank (``producer.remote``): it holds no
    current weights, so its items enter with the buffer's largest priority.
    """
    if getattr(producer, "remote", None) is not None:
        return None
    values = producer.initial_priorities(batch)
    return None if values is None else _checked(values, n, f"{type(producer).__name__}.initial_priorities")


def sample_reply_for(replay: ReplayBuffer, n: int, step: int) -> Outgoing:
    """The answer to a request for ``n`` items from a learner at ``step`` (beta anneals with it)."""
    if not replay.can_sample(n):
        return protocol.sample_reply(None)
    batch, info = replay.sample(n, step=step)
    if not replay.sampler.prioritized:
        return protocol.sample_reply(batch, info["policy_version"])
    return protocol.sample_reply(batch, info["policy_version"], weights=info["weights"], keys=info["keys"])


def replayed_batch(body: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
    """The replayed items of a sample reply, with ``weights`` and ``keys`` when it has them."""
    batch = body.get("batch")
    if batch is None or "keys" not in body:
        return batch
    return {**batch, "weights": body["weights"], "keys": body["keys"]}


def priority_update(trainer: Trainer, batch: dict[str, torch.Tensor], replayed: int) -> Outgoing | None:
    """The :func:`~gflowdist.runtime.protocol.priorities` message for the last ``replayed`` items of
    ``batch``, or None (nothing replayed with keys, or the trainer gives no priorities)."""
    if not replayed or "keys" not in batch:
        return None
    values = trainer.priorities(batch)
    if values is None:
        return None
    keys = batch["keys"]
    values = _checked(values, int(keys.shape[0]), f"{type(trainer).__name__}.priorities")
    return protocol.priorities(keys[-replayed:].to("cpu"), values[-replayed:])


def apply_priority_update(replay: ReplayBuffer, body: Mapping[str, Any], sender: int) -> int:
    """Apply a trainer's priority update; returns how many items it reached (the rest were stale)."""
    try:
        return replay.update_priorities(body["keys"], body["priorities"])
    except (KeyError, TypeError, ValueError) as err:
        raise GflowdistError(f"the priority update from rank {sender} cannot be applied: {err}") from err
