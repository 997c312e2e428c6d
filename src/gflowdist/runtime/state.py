"""What each role's loop carries from one step to the next, typed, and what a checkpoint keeps of it.

One dataclass per role. The loop updates its fields in place; the job
runner's :class:`~gflowdist.runtime.checkpoints.CheckpointSaver` holds the
same object and saves :meth:`RunState.to_dict` in every checkpoint; a resumed
run :meth:`RunState.load`\\ s it back. Fields named in ``TRANSIENT`` are not
checkpointed.

``produced`` counts trajectories, and so is also the sequence number of the
next one: what a client stamps on a batch (the ``seq`` of
:func:`~gflowdist.runtime.protocol.trajectories`), not a message number.
"""

from __future__ import annotations

import collections
import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from gflowdist.layout import Role
from gflowdist.transport.messages import Message, MessageType

__all__ = ["RunState", "TrainerState", "ActorState", "BufferState", "CoordinatorState", "state_for"]


@dataclass
class RunState:
    """The base of every role's state (the coordinator's has no fields)."""

    TRANSIENT: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The checkpointed fields, as plain values."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.TRANSIENT}

    def load(self, saved: Mapping[str, Any]) -> None:
        """Take the checkpointed fields from ``saved`` (a :meth:`to_dict`), in place."""
        for f in dataclasses.fields(self):
            if f.name not in self.TRANSIENT and f.name in saved:
                setattr(self, f.name, saved[f.name])


@dataclass
class TrainerState(RunState):
    """A trainer's step, policy version and trajectory count (checkpointed) and its staleness histogram."""

    step: int = 0  # steps done, counted over this run and the runs it resumed
    version: int = 0  # my policy version: + 1 at every optimizer step
    produced: int = 0  # trajectories I produced (= the sequence number of my next one)
    #: policy versions my replayed trajectories were behind mine -> count (reported, not checkpointed)
    staleness: Counter[int] = field(default_factory=Counter)

    TRANSIENT: ClassVar[tuple[str, ...]] = ("staleness",)


@dataclass
class ActorState(RunState):
    """The policy version an actor samples with and its trajectory count (both checkpointed)."""

    version: int = 0  # the policy version of the weights I sample with
    produced: int = 0  # trajectories I produced (= the sequence number of my next one)


@dataclass
class BufferState(RunState):
    """The newest policy version a buffer has heard of, from which ``replay.max_staleness`` counts, and the
    batches a full queue parked (both checkpointed).

    A parked batch was received (the ledger counted it) but not yet admitted; a checkpoint
    keeps it, in arrival order, so that the resumed queue admits it (or drops it, with its
    reason) as the uninterrupted run would have, and the ledger stays exact across the cut.
    """

    latest_version: int = 0  # the newest policy version my clients told me of (replay.max_staleness counts from it)
    #: a queue's received batches waiting for room, oldest first (``replay.sampler: queue``)
    parked: collections.deque[Message] = field(default_factory=collections.deque)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["parked"] = [{"sender": m.sender, "seq": m.seq, "body": _owned(m.body)} for m in self.parked]
        return out

    def load(self, saved: Mapping[str, Any]) -> None:
        super().load(saved)
        self.parked = collections.deque(
            Message(MessageType.TRAJECTORIES, int(p["sender"]), int(p["seq"]), p["body"])
            for p in saved.get("parked", ())
        )


def _owned(value: Any) -> Any:
    """``value`` with every tensor copied out of the buffer it was received in (a message's arrays are views)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return {k: _owned(v) for k, v in value.items()}
    return value


@dataclass
class CoordinatorState(RunState):
    """The coordinator keeps nothing of its own between steps."""


def state_for(role: Role) -> RunState:
    """A fresh state for a rank of ``role``."""
    kinds: dict[Role, type[RunState]] = {
        Role.TRAINER: TrainerState,
        Role.ACTOR: ActorState,
        Role.INFERENCE: ActorState,  # the policy version it acts with
        Role.BUFFER: BufferState,
        Role.COORDINATOR: CoordinatorState,
    }
    return kinds[role]()
