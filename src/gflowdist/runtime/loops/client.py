"""What the two clients of a buffer (trainers and actors) do alike: ship, cut a checkpoint, finish."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from gflowdist.errors import DeadlineError, GflowdistError, PeerLostError
from gflowdist.runtime import protocol
from gflowdist.runtime.loops.batches import role_method
from gflowdist.runtime.loops.priorities import initial_priorities
from gflowdist.runtime.protocol import Command, command_of
from gflowdist.runtime.roles import Actor
from gflowdist.runtime.state import ActorState, TrainerState
from gflowdist.runtime.tape import Site, batch_digest
from gflowdist.runtime.wiring import Wiring
from gflowdist.transport import Message
from gflowdist.transport.channel import Channel

__all__ = [
    "trajectory_count",
    "concat_batches",
    "ship",
    "use_locally",
    "reply_from",
    "checkpoint_cut",
    "finish",
    "drain_live",
]


def trajectory_count(batch: Mapping[str, torch.Tensor]) -> int:
    """Number of trajectories in a batch (the leading dimension, equal for every tensor field)."""
    sizes = {int(v.shape[0]) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(sizes) != 1:
        raise GflowdistError(f"a trajectory batch needs one leading batch dimension, found sizes {sorted(sizes)}")
    return sizes.pop()


def concat_batches(
    fresh: Mapping[str, torch.Tensor] | None,
    replayed: Mapping[str, torch.Tensor] | None,
    device: torch.device | str = "cpu",
) -> dict[str, Any] | None:
    """Fresh trajectories followed by replayed ones, field by field (fields only ``fresh`` has stay as they are).

    Replayed tensors (received into host memory) move to the device of the fresh ones first (to
    ``device`` when there are no fresh ones). ``weights`` and ``keys`` of prioritized replay are
    1 and -1 for the fresh items. None when there is neither.
    """
    if not replayed:
        return None if fresh is None else dict(fresh)
    if fresh is None:
        return {k: v.to(device) for k, v in replayed.items()}
    first = next(iter(fresh.values()))
    pad = {
        "weights": torch.ones(first.shape[0], device=first.device),
        "keys": torch.full((first.shape[0],), -1, dtype=torch.int64, device=first.device),
    }
    fresh = {**{k: v for k, v in pad.items() if k in replayed}, **fresh}
    return {k: torch.cat([fresh[k], replayed[k].to(fresh[k].device)]) if k in replayed else fresh[k] for k in fresh}


def ship(w: Wiring, producer: Actor, batch: dict[str, Any], state: TrainerState | ActorState, buffer: int) -> int:
    """Send ``batch`` to my buffer (asynchronously), stamped with my policy version and the
    ``producer``'s initial priorities (if any); returns its size."""
    n = trajectory_count(batch)
    priorities = initial_priorities(producer, batch, n)
    w.choices.check(
        Site.BATCH, state.produced, lambda: batch_digest(batch)
    )  # before it leaves: a diverged rank names itself
    w.ledger.produced += n
    if isinstance(state, TrainerState):  # a refusal of this batch names the step that made it
        w.liveness.refusals.shipped(state.produced, state.step, role_method(producer, "rollout"))
    w.data.isend(
        *protocol.trajectories(batch, seq=state.produced, version=state.version, n=n, priorities=priorities), buffer
    )
    w.ledger.sent += n
    state.produced += n
    return n


def use_locally(w: Wiring, batch: dict[str, Any], state: TrainerState) -> None:
    """Count ``batch`` as produced and used here (a trainer without a buffer)."""
    n = trajectory_count(batch)
    w.ledger.produced += n
    w.ledger.used_locally += n
    state.produced += n


def reply_from(w: Wiring, buffer: int, timeout: float) -> Message:
    """My buffer's answer (to a sample request or a checkpoint marker); a buffer that never answers is lost."""
    try:
        return w.data.recv(buffer, timeout=timeout)
    except DeadlineError as err:
        layout = w.context.layout
        raise PeerLostError(
            buffer,
            role=layout.role_of(buffer).value,
            host=layout.host_of(buffer),
            reason=f"no reply to a sample request within {timeout:g} s",
        ) from err


def checkpoint_cut(w: Wiring, buffer: int | None, actors: Sequence[int], name: str) -> dict[str, Any] | None:
    """My side of periodic checkpoint ``name``: the marker after my last trajectory, my buffer's ack, my save.

    My actors get the marker too (they make their own cut). The buffer answers
    once every client's marker has arrived, so it saves exactly what the
    clients produced before the cut (see :mod:`gflowdist.runtime.checkpoints`).
    Returns my file's size and digest (:meth:`Reporting.checkpoint <gflowdist.runtime.reporting.Reporting.checkpoint>`).
    """
    for actor in actors:
        w.weights.isend(*protocol.checkpoint(name), actor)
    if buffer is not None:
        w.data.send(*protocol.checkpoint(name), buffer)
        with w.timer.phase("checkpoint"), w.timer.wait_on(buffer, "checkpoint"):
            ack = reply_from(w, buffer, w.settings.reply_timeout_s)
        if command_of(ack) is not Command.CHECKPOINTED or ack.body.get("name") != name:
            raise GflowdistError(
                f"expected the acknowledgement of checkpoint {name} from buffer rank "
                f"{buffer}, got a {ack.type.name} message"
            )
        # a batch of mine refused before my marker fails me (on_bad_batch: fail) before I save past it
        w.liveness.hear_refusals(int(ack.body.get("refused", 0)))
    with w.timer.phase("checkpoint"):
        return w.reports.checkpoint(name)


def finish(w: Wiring, buffer: int | None) -> None:
    """Tell my buffer I am done (after my last trajectory, on the same channel), then drain my sends."""
    if buffer is not None:
        w.data.send(*protocol.done(), buffer)
    w.data.drain()


def drain_live(w: Wiring, channel: Channel, peers: Sequence[int]) -> None:
    """Wait for my sends on ``channel`` to ``peers``, listening to the collector meanwhile.

    A peer the run goes on without (``faults.on_actor_loss: continue``) is
    not waited for: its sends can never complete. :class:`DeadlineError`
    names a live peer whose sends are still pending after the channel's
    send timeout.
    """
    deadline = time.monotonic() + channel.send_timeout
    waiting = [p for p in peers if p not in w.lost and channel.in_flight(p)]
    while waiting:
        if time.monotonic() > deadline:
            raise DeadlineError(
                f"{channel.in_flight(waiting[0])} sends to rank {waiting[0]} did not complete "
                f"within {channel.send_timeout:g} s",
                peer=waiting[0],
            )
        w.liveness.heartbeat(-1)
        w.liveness.check_control()
        time.sleep(0.002)
        waiting = [p for p in peers if p not in w.lost and channel.in_flight(p)]
