"""The runtime's protocol: every message one rank sends another, in one place.

Four channels, each a tag on the world communicator (:class:`Tags`). On one
channel, messages between two ranks arrive in the order they were sent.

| channel | between |
|---|---|
| `DATA` | a client (trainer or actor) and its buffer: trajectories, sample requests and replies, priority updates, checkpoint markers, `done` |
| `CONTROL` | every rank and the collector (the coordinator, else rank 0): heartbeats, metrics, summaries, `saved`, `stop`, `lost`, final reports; a buffer and a client whose batch it refused: `refused` |
| `WEIGHTS` | a trainer and its actors: weights, checkpoint markers, `stop`; a trainer and its inference ranks (`layout.inference`): weights, `stop` |
| `INFERENCE` | an actor and its inference rank: observations, the actions for them, `done` |

Every message: its constructor here, its
:class:`~gflowdist.transport.MessageType` (and :class:`Command`), its channel,
who sends it to whom, and where it is sent and handled.

| constructor | type | channel | from -> to | sent in / handled in |
|---|---|---|---|---|
| :func:`trajectories` | TRAJECTORIES | DATA | client -> its buffer | :func:`client.ship` / :meth:`BufferLoop.admit` |
| :func:`sample_request` | SAMPLE_REQUEST | DATA | trainer -> its buffer | :meth:`ReplayRequests.take` / :meth:`BufferLoop.serve_sample` |
| :func:`sample_reply` | SAMPLE_REPLY | DATA | buffer -> the trainer that asked | :meth:`BufferLoop.serve_sample` / :meth:`ReplayRequests.take` |
| :func:`priorities` | PRIORITIES | DATA | trainer -> its buffer, after a step that learned from replayed items | :meth:`TrainerLoop.return_priorities` / :meth:`BufferLoop.handle` |
| :func:`done` | CONTROL `done` | DATA | client -> its buffer, after its last trajectory | :func:`client.finish` / :meth:`BufferLoop.handle` |
| :func:`checkpoint` | CONTROL `checkpoint` | DATA, WEIGHTS | client -> its buffer, trainer -> its actors: the cut of a periodic checkpoint | :func:`client.checkpoint_cut` / :meth:`BufferLoop.handle`, :func:`actor.read_inbox` |
| :func:`checkpointed` | CONTROL `checkpointed` | DATA | buffer -> each client, once it saved at the cut | :meth:`BufferLoop.save_complete_cuts` / :func:`client.checkpoint_cut` |
| :func:`infer_request` | INFER_REQUEST | INFERENCE | actor -> its inference rank: observations to act on | :class:`RemotePolicy` / :meth:`InferenceLoop.gather` |
| :func:`infer_reply` | INFER_REPLY | INFERENCE | inference rank -> the actor that asked: the policy's outputs, its version, the batch | :meth:`InferenceLoop.serve` / :class:`RemotePolicy` |
| :func:`infer_refused` | INFER_REPLY | INFERENCE | inference rank -> an actor whose request it cannot batch (its shapes changed) | :meth:`InferenceLoop.gather` / :class:`RemotePolicy` |
| :func:`done` | CONTROL `done` | INFERENCE | actor -> its inference rank, after its last request | :meth:`RemotePolicy.finish` / :meth:`InferenceLoop.gather` |
| :func:`policy_version` | CONTROL `version` | WEIGHTS | trainer -> its actors that have an inference rank, with each send of weights to it: how far learning is (their pacing) | :meth:`TrainerLoop.send_weights` / :func:`actor.read_inbox` |
| :func:`weights` | WEIGHTS | WEIGHTS, CONTROL | trainer -> its actors, or its inference ranks when it has them (WEIGHTS); the first trainer -> the coordinator (CONTROL, every `sync.weights_to_coordinator_every` steps) | :meth:`TrainerLoop.send_weights`, :meth:`TrainerLoop.publish` / :func:`actor.read_inbox`, :meth:`Collector.poll` |
| :func:`stop` | CONTROL `stop` | CONTROL, WEIGHTS | coordinator -> trainers and actors; trainer -> its actors | :func:`coordinator.run_coordinator`, :meth:`TrainerLoop.finish` / :meth:`Liveness.check_control`, :func:`actor.read_inbox` |
| :func:`heartbeat` | HEARTBEAT | CONTROL | every rank <-> the collector | :meth:`Liveness.heartbeat` / :meth:`Collector.poll`, :meth:`Liveness.check_control` |
| :func:`metrics` | METRICS | CONTROL | trainer, actor -> collector | :meth:`TrainerLoop.publish`, :func:`actor.run_actor` / :meth:`Collector.poll` |
| :func:`summary` | USER | CONTROL | buffer -> collector | :meth:`BufferLoop.idle`, :meth:`BufferLoop.run` / :meth:`Collector.poll` |
| :func:`saved` | CONTROL `saved` | CONTROL | rank -> collector: my part of a checkpoint is saved | :meth:`Reporting.checkpoint` / :meth:`Collector.poll` |
| :func:`final_report` | LEDGER | CONTROL | every rank -> collector, last | :meth:`Reporting.send_final` / :meth:`Collector.poll` |
| :func:`refused` | CONTROL `refused` | CONTROL | buffer -> the client whose batch it could not store | :meth:`BufferLoop.admit` / :meth:`Liveness.check_control` |
| :func:`lost` | CONTROL `lost` | CONTROL | collector -> every rank still running, when it goes on without a lost actor (`faults.on_actor_loss: continue`) | :meth:`Collector.poll` / :meth:`Liveness.check_control` |
| :func:`replaced` | CONTROL `replaced` | CONTROL | collector -> the trainer and buffer of a lost actor it replaced with a spare (`faults.on_actor_loss: replace`) | :meth:`Replacer.replace` / :meth:`Liveness.check_control` (:func:`replacing.adopt`) |
| :func:`spare_lost` | CONTROL `spare_lost` | CONTROL | collector -> every rank still running, when an idle spare actor fell silent (`faults.on_actor_loss: replace`): the death hydra signalled was not a rank's | :meth:`Replacer.watch_spares` / :meth:`Liveness.check_control` |
| :func:`adopted` | CONTROL `adopted` | CONTROL | that trainer or buffer -> collector, once it reaches the replacement | :func:`replacing.adopt` / :meth:`Collector.poll` |
| :func:`failed` | CONTROL `failed` | CONTROL | a failing rank -> collector: its failure and what it holds | :func:`postmortem.end_failed` / :meth:`Collector.poll` (and the post-mortem's gathering) |
| :func:`postmortem` | CONTROL `postmortem` | CONTROL | collector -> every live rank, once the run failed | :func:`postmortem.end_failed` / :meth:`Liveness.check_control` |
| :func:`partial` | CONTROL `partial` | CONTROL | each rank -> collector, the answer to `postmortem`: what it holds | :func:`postmortem.end_failed` / the post-mortem's gathering |

A ``CONTROL`` message carries its :class:`Command` in its body's ``"cmd"``;
:func:`command_of` reads it. A constructor returns ``(MessageType, body)``,
what :meth:`Channel.isend` takes first: ``w.data.isend(*protocol.done(), buffer)``.

Prioritized replay (``replay.sampler: prioritized``) adds to three bodies:
:func:`trajectories` may carry the producer's ``priorities`` (one per item),
:func:`sample_reply` carries each item's importance ``weights`` and ``keys``
(slot and generation, see :mod:`gflowdist.replay.priorities`), and
:func:`priorities` takes the learner's new priorities back to the buffer with
those keys. Nobody waits for a :func:`priorities` message.

Two numbers are called a sequence number and are not the same: the body of
:func:`trajectories` has ``seq``, the producer's number of the batch's first
trajectory (it counts trajectories: the ledger's and the replay buffer's
``(producer, seq)``), while :attr:`Message.seq` numbers the messages of one
channel (the transport's loss check).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.transport import Message, MessageType

__all__ = [
    "Tags",
    "Command",
    "MessageType",
    "Outgoing",
    "trajectories",
    "sample_request",
    "sample_reply",
    "priorities",
    "done",
    "checkpoint",
    "checkpointed",
    "weights",
    "replaced",
    "adopted",
    "stop",
    "heartbeat",
    "metrics",
    "summary",
    "saved",
    "refused",
    "lost",
    "failed",
    "postmortem",
    "partial",
    "final_report",
    "infer_request",
    "infer_reply",
    "infer_refused",
    "policy_version",
    "command_of",
    "is_command",
]

#: What a constructor returns: the message type and the body, as ``Channel.isend`` takes them.
Outgoing = tuple[MessageType, Any]


class Tags:
    """The runtime's channels: tags on the world communicator (see the module docstring)."""

    DATA = 1
    CONTROL = 2
    WEIGHTS = 3
    INFERENCE = 5
    #: not a channel: raw ping-pongs at start-up measuring clock offsets for trace.json (runtime.observing)
    CLOCK = 4


class Command(enum.Enum):
    """The command of a ``CONTROL`` message (its body's ``"cmd"``; the values are on the wire)."""

    #: client -> its buffer (DATA), after its last trajectory: serve me no more
    DONE = "done"
    #: trainer -> its actors (WEIGHTS), client -> its buffer (DATA): checkpoint ``name`` is cut here
    CHECKPOINT = "checkpoint"
    #: buffer -> a client (DATA): my part of checkpoint ``name`` is saved; go on
    CHECKPOINTED = "checkpointed"
    #: rank -> collector (CONTROL): my part of checkpoint ``name`` is saved
    SAVED = "saved"
    #: coordinator -> trainers and actors (CONTROL, with a ``reason``), trainer -> its actors (WEIGHTS)
    STOP = "stop"
    #: buffer -> a client (CONTROL): your batch could not be stored (``text`` says why)
    REFUSED = "refused"
    #: trainer -> its actors whose policy runs on an inference rank (WEIGHTS): my policy is at ``version`` now
    VERSION = "version"
    #: collector -> the trainer and buffer of a lost actor (CONTROL): go on without ``rank``
    LOST = "lost"
    #: a failing rank -> collector (CONTROL): its ``failure`` and the ``state`` it holds (the post-mortem's)
    FAILED = "failed"
    #: collector -> every live rank (CONTROL): the run failed; send what you hold and stop
    POSTMORTEM = "postmortem"
    #: rank -> collector (CONTROL): the ``state`` I hold, for the post-mortem
    PARTIAL = "partial"
    #: collector -> the trainer and buffer of a lost actor (CONTROL): spare actor ``spare`` replaces it
    REPLACED = "replaced"
    #: trainer or buffer -> collector (CONTROL): I reach replacement ``rank`` now; ``received`` from the lost one
    ADOPTED = "adopted"
    #: collector -> every rank still running (CONTROL): idle spare actor ``spare`` fell silent (``reason``)
    SPARE_LOST = "spare_lost"


_COMMANDS = {command.value: command for command in Command}


def _command(command: Command, **fields: Any) -> Outgoing:
    return MessageType.CONTROL, {"cmd": command.value, **fields}


# -- constructors: one per message ----------------------------------------------------------------


def trajectories(
    batch: Mapping[str, torch.Tensor], *, seq: int, version: int, n: int, priorities: torch.Tensor | None = None
) -> Outgoing:
    """``n`` trajectories sampled with policy ``version``; ``seq`` numbers the first (see the module docstring).

    ``priorities``: the producer's initial priority of each (prioritized replay), or None.
    """
    body = {"batch": batch, "seq": seq, "version": version, "n": n}
    if priorities is not None:
        body["priorities"] = priorities
    return MessageType.TRAJECTORIES, body


def sample_request(n: int, version: int, step: int | None = None) -> Outgoing:
    """Ask my buffer for ``n`` replayed trajectories; ``version`` is my policy's now, ``step`` the learner
    step at which the reply will be used (a prioritized buffer's beta is taken there; default ``version``)."""
    return MessageType.SAMPLE_REQUEST, {"n": n, "version": version, "step": version if step is None else step}


def sample_reply(
    batch: Mapping[str, torch.Tensor] | None,
    versions: torch.Tensor | None = None,
    *,
    weights: torch.Tensor | None = None,
    keys: torch.Tensor | None = None,
) -> Outgoing:
    """A sampled batch and the policy version of each trajectory, or ``batch=None``: not enough stored yet.

    From a prioritized buffer also each item's importance ``weights`` and ``keys``.
    """
    if batch is None:
        return MessageType.SAMPLE_REPLY, {"batch": None}
    body = {"batch": batch, "versions": versions}
    if keys is not None:
        body.update(weights=weights, keys=keys)
    return MessageType.SAMPLE_REPLY, body


def priorities(keys: torch.Tensor, values: torch.Tensor) -> Outgoing:
    """New priorities of replayed items, named by the ``keys`` their sample reply carried."""
    return MessageType.PRIORITIES, {"keys": keys, "priorities": values}


def done() -> Outgoing:
    """My last trajectory was sent before this (same channel): my buffer may count me finished."""
    return _command(Command.DONE)


def checkpoint(name: str) -> Outgoing:
    """The cut of periodic checkpoint ``name``: everything I sent before it belongs to the checkpoint."""
    return _command(Command.CHECKPOINT, name=name)


def checkpointed(name: str, refused: int = 0) -> Outgoing:
    """The buffer saved its part of checkpoint ``name`` (every client's marker had arrived); ``refused``:
    how many of this client's batches it has refused so far (each refusal went out before this)."""
    return _command(Command.CHECKPOINTED, name=name, refused=refused)


def weights(state: Mapping[str, torch.Tensor], version: int) -> Outgoing:
    """A trainer's model weights, stamped with its policy version."""
    return MessageType.WEIGHTS, {"version": version, "state": state}


def stop(reason: str | None = None) -> Outgoing:
    """End the run: from the coordinator (with its ``reason``) or from a trainer to its actors."""
    return _command(Command.STOP) if reason is None else _command(Command.STOP, reason=reason)


def heartbeat(step: int, **extra: Any) -> Outgoing:
    """I am alive, at ``step`` (plus plain values, e.g. what a buffer stores)."""
    return MessageType.HEARTBEAT, {"step": step, **extra}


def metrics(values: Mapping[str, Any]) -> Outgoing:
    """A trainer's metrics of one step (``step``, ``loss``, ``trajectories``, the user's), or an actor's
    (``step``: the policy version it acts with, ``trajectories``, the user's)."""
    return MessageType.METRICS, dict(values)


def summary(values: Mapping[str, Any]) -> Outgoing:
    """A role's :meth:`~gflowdist.runtime.roles.BaseRole.summary` for the coordinator."""
    return MessageType.USER, values


def saved(name: str, file: Mapping[str, Any]) -> Outgoing:
    """My part of periodic checkpoint ``name`` is on disk; ``file``: its ``bytes`` and ``sha256`` for the manifest."""
    return _command(Command.SAVED, name=name, file=dict(file))


def refused(text: str, seq: int) -> Outgoing:
    """A buffer could not store the receiver's batch ``seq``; ``text`` names both ranks, the field, expected vs got."""
    return _command(Command.REFUSED, text=text, seq=seq)


def lost(rank: int, reason: str) -> Outgoing:
    """The collector lost actor ``rank`` (``reason``) and the run goes on without it."""
    return _command(Command.LOST, rank=rank, reason=reason)


def replaced(rank: int, spare: int) -> Outgoing:
    """Lost actor ``rank`` is replaced (``faults.on_actor_loss: replace``) by spare actor ``spare``: reach it at that
    rank of the spares' intercommunicator (:mod:`gflowdist.runtime.replacing`)."""
    return _command(Command.REPLACED, rank=rank, spare=spare)


def spare_lost(spare: int, reason: str) -> Outgoing:
    """Idle spare actor ``spare`` (its rank in the spares' intercommunicator) fell silent (``reason``): the death
    hydra signalled (SIGUSR1) may have been its, not a rank's, so sending to the actors is safe again."""
    return _command(Command.SPARE_LOST, spare=spare, reason=reason)


def adopted(rank: int, received: int) -> Outgoing:
    """I reach the replacement of ``rank`` now; ``received``: the trajectories I received from the lost one."""
    return _command(Command.ADOPTED, rank=rank, received=received)


def failed(failure: Mapping[str, Any], state: Mapping[str, Any]) -> Outgoing:
    """I failed (``failure``: :meth:`Failure.to_dict <gflowdist.runtime.failures.Failure.to_dict>`); ``state``:
    what I hold (my final report so far, ``partial``)."""
    return _command(Command.FAILED, failure=dict(failure), state=dict(state))


def postmortem(written: str | None = None) -> Outgoing:
    """The run failed: send the collector what you hold (:func:`partial`) and stop; with ``written`` (the failure
    line), the post-mortem is written and a rank waiting for the end may end."""
    return _command(Command.POSTMORTEM) if written is None else _command(Command.POSTMORTEM, written=written)


def partial(state: Mapping[str, Any]) -> Outgoing:
    """What I hold when the run failed elsewhere: my final report so far (``partial``)."""
    return _command(Command.PARTIAL, state=dict(state))


def final_report(report: Mapping[str, Any]) -> Outgoing:
    """My last message: role, host, ledger, timers, channel statistics and the role's extras."""
    return MessageType.LEDGER, report


def policy_version(version: int) -> Outgoing:
    """My policy is at ``version`` (to an actor whose policy runs on an inference rank: it paces itself by it)."""
    return _command(Command.VERSION, version=version)


def infer_request(obs: torch.Tensor, args: list[torch.Tensor], seq: int) -> Outgoing:
    """Act on ``obs`` (``[n, *obs_shape]``) with the per-row ``args`` (e.g. each row's epsilon); ``seq``
    numbers my requests."""
    return MessageType.INFER_REQUEST, {"obs": obs, "args": list(args), "seq": seq}


def infer_reply(
    out: torch.Tensor | Mapping[str, torch.Tensor], *, version: int, seq: int, batch: int, size: int
) -> Outgoing:
    """The policy's outputs for request ``seq`` (its rows only), made by policy ``version`` in the inference
    rank's batch number ``batch`` of ``size`` observations."""
    return MessageType.INFER_REPLY, {"out": out, "version": version, "seq": seq, "batch": batch, "size": size}


def infer_refused(text: str, seq: int) -> Outgoing:
    """Request ``seq`` cannot be batched; ``text`` names the actor, the field, expected vs got."""
    return MessageType.INFER_REPLY, {"refused": text, "seq": seq}


# -- predicates ---------------------------------------------------------------------------------


def command_of(msg: Message) -> Command | None:
    """The :class:`Command` of a ``CONTROL`` message; None for any other message or an unknown command."""
    if msg.type is not MessageType.CONTROL or not isinstance(msg.body, Mapping):
        return None
    cmd = msg.body.get("cmd")
    return _COMMANDS.get(cmd) if isinstance(cmd, str) else None


def is_command(msg: Message, command: Command) -> bool:
    """True when ``msg`` is the ``CONTROL`` message of ``command``."""
    return command_of(msg) is command
