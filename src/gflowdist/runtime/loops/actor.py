"""The actor's loop: apply the newest weights my trainer sent, cut any checkpoint it asked for, roll out, ship.

    per step: read my trainer's messages (weights, checkpoint markers, stop)
              -> apply the newest weights -> checkpoint cuts -> rollout -> ship -> heartbeat
    until my trainer (or the coordinator) says stop; then finish

A rollout of None ships nothing (the step backs off briefly); every
``run.log_every`` rollouts my :meth:`Actor.metrics` go to the collector.
The loop's iterations are counted (``turn``): the points at which my tape
records what I took from my trainer and when I saw a stop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gflowdist.comm.polling import Backoff
from gflowdist.errors import GflowdistError
from gflowdist.runtime import protocol
from gflowdist.runtime.loops.batches import check_batch, role_method
from gflowdist.runtime.loops.client import checkpoint_cut, finish, ship
from gflowdist.runtime.protocol import Command, MessageType, command_of, is_command
from gflowdist.runtime.remote_policy import RemotePolicy
from gflowdist.runtime.roles import Actor
from gflowdist.runtime.state import ActorState
from gflowdist.runtime.tape import Site
from gflowdist.runtime.wiring import Wiring
from gflowdist.transport import Message

__all__ = ["run_actor", "Inbox"]


@dataclass
class Inbox:
    """What my trainer sent since the last step: the newest weights, checkpoint names, whether to stop."""

    weights: Message | None = None
    announced: int | None = None  # the newest policy version my trainer announced (I act through an inference rank)
    cuts: list[str] = field(default_factory=list)
    stopped: bool = False


def run_actor(actor: Actor, w: Wiring, state: ActorState) -> ActorState:
    """Run the actor loop until my trainer says stop; ``state`` is updated in place and returned.

    With an inference rank (``layout.inference``) my policy runs there: ``actor.remote`` is a
    :class:`~gflowdist.runtime.remote_policy.RemotePolicy`, no weights come from my trainer, and each
    rollout is stamped with the oldest policy version among its replies (the newest answered before it when it
    asked nothing); my trainer's announced versions (:func:`~gflowdist.runtime.protocol.policy_version`) pace it.
    """
    placement = w.context.placement
    trainer, buffer = placement.trainer, placement.buffer
    if trainer is None or buffer is None:  # the layout gives every actor both (gflowdist.layout)
        raise GflowdistError(f"actor rank {w.rank} has no {'trainer' if trainer is None else 'buffer'} in the layout")
    remote = RemotePolicy(w, placement.inference) if placement.inference is not None else None
    if remote is not None:
        remote.version = state.version
        actor.remote = remote
    inbox = Inbox()
    rollouts = turn = 0
    idle = Backoff(spin_s=0.0, first_sleep_s=1e-4, max_sleep_s=0.01)
    while not inbox.stopped and not w.choices.stop_seen(turn):
        inbox = read_inbox(w, trainer, turn)
        apply_weights(actor, w, state, inbox.weights)
        for name in inbox.cuts:
            checkpoint_cut(w, buffer, (), name)
        if inbox.stopped:
            break
        if remote is not None:
            remote.announced = max(remote.announced, inbox.announced or 0)
            remote.mark()
        with w.timer.phase("rollout"):
            batch = actor.rollout(state.version if remote is None else remote.pace_version)
        if remote is not None:
            state.version = remote.stamp()
        if batch is None:  # nothing to send now (e.g. pacing itself): keep listening, ask again soon
            with w.timer.phase("idle"):
                idle.pause()
        else:
            check_batch(batch, role_method(actor, "rollout"), nonfinite=w.settings.on_nonfinite_batch)
            idle.reset()
            with w.timer.phase("send"):
                ship(w, actor, batch, state, buffer)
            rollouts += 1
            if rollouts % w.settings.log_every == 0:
                report_metrics(actor, w, state)
        w.liveness.heartbeat(state.produced)
        turn += 1
    if not inbox.stopped:
        await_trainer_stop(w, trainer)
    if remote is not None:
        remote.finish()
    finish(w, buffer)
    return state


def report_metrics(actor: Actor, w: Wiring, state: ActorState) -> None:
    """My metrics to the collector; ``step`` is the policy version I act with."""
    metrics = actor.metrics()
    if metrics:
        w.reports.report(protocol.metrics({"step": state.version, "trajectories": state.produced, **metrics}))


def read_inbox(w: Wiring, trainer: int, point: int) -> Inbox:
    """Every message my trainer sent since the last look, without waiting (replayed: those taken at ``point``)."""
    inbox = Inbox()
    msg = w.choices.take(Site.INBOX, w.weights, point, source=trainer, wait=True)
    while msg is not None:
        command = command_of(msg)
        if command is Command.CHECKPOINT:
            inbox.cuts.append(msg.body["name"])
        elif command is Command.STOP:
            inbox.stopped = True
        elif command is Command.VERSION:
            inbox.announced = max(inbox.announced or 0, int(msg.body["version"]))
        elif msg.type is MessageType.WEIGHTS:
            inbox.weights = msg  # only the newest counts
        msg = w.choices.take(Site.INBOX, w.weights, point, source=trainer, wait=True)
    return inbox


def apply_weights(actor: Actor, w: Wiring, state: ActorState, msg: Message | None) -> None:
    """Load the weights of ``msg`` (if any) and sample with their policy version from now on."""
    if msg is None:
        return
    with w.timer.phase("load_weights"):
        actor.load_weights(msg.body["state"], msg.body["version"])
    state.version = msg.body["version"]


def await_trainer_stop(w: Wiring, trainer: int) -> None:
    """Stopped by the coordinator: read until my trainer's own stop, so no weights stay on the wire."""
    msg = None
    while msg is None or not is_command(msg, Command.STOP):
        msg = w.weights.recv(trainer, timeout=w.settings.weights_timeout_s)
