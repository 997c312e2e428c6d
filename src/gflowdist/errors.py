"""The one small exception hierarchy of gflowdist.

Every error raised on behalf of another rank says which rank it was, its role
(when known) and its host, so a message from a 64-rank job points at one
process. Config errors name the file and the key path.

    GflowdistError
    ├── ConfigError        a config file / dict / override is wrong (file, key path)
    ├── LayoutError        the rank layout is impossible (the arithmetic is explained)
    ├── TransportError     a send / receive failed
    │   ├── ProtocolError  a received message is malformed (names the sender rank)
    │   └── DeadlineError  a blocking wait passed its deadline (also a TimeoutError)
    ├── PeerLostError      a rank stopped answering or died (rank, role, host)
    ├── LedgerError        trajectories were lost: produced != delivered + dropped
    ├── CheckpointError    a checkpoint cannot be written or read (the file, what is wrong)
    ├── ReplayDivergence   a replayed run stopped doing what the recorded one did (rank, step, event)
    ├── BadBatchError      a buffer refused a client's batch (sender, field, expected vs got)
    ├── BatchError         a role returned something that is no batch (role class, method, field)
    └── NonFiniteLossError a trainer's loss is NaN or infinite (rank, step)
"""

from __future__ import annotations

__all__ = [
    "GflowdistError",
    "ConfigError",
    "LayoutError",
    "TransportError",
    "ProtocolError",
    "DeadlineError",
    "PeerLostError",
    "LedgerError",
    "CheckpointError",
    "ReplayDivergence",
    "BadBatchError",
    "BatchError",
    "NonFiniteLossError",
    "describe_peer",
]


def describe_peer(rank: int | None, role: str | None = None, host: str | None = None) -> str:
    """``"rank 3 (buffer on node-b)"`` from whatever is known about a peer."""
    if rank is None:
        return "an unknown rank"
    extra = " on ".join(part for part in (role, host) if part)
    return f"rank {rank} ({extra})" if extra else f"rank {rank}"


class GflowdistError(Exception):
    """Base class of every error gflowdist raises on purpose."""


class ConfigError(GflowdistError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or impossible.

    ``str(err)`` reads ``"<file>: <key.path>: <what was expected>"``.
    """

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None):
        self.key = key
        self.file = file
        self.detail = message
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class LayoutError(GflowdistError, ValueError):
    """The requested rank layout cannot be built; the message explains the arithmetic.

    ``fact`` is what does not add up, ``fix`` (may be None) what to change; the
    message is ``"<fact>; <fix>"``. A caller that knows better words for the fix
    (``gflowdist run``: ``start -n 3``) words its own from ``fact``.
    """

    def __init__(self, fact: str, *, fix: str | None = None):
        self.fact, self.fix = fact, fix
        super().__init__(fact if fix is None else f"{fact}; {fix}")


class TransportError(GflowdistError):
    """A point-to-point send or receive failed.

    ``peer`` is the other rank (sender for receives, destination for sends).
    """

    def __init__(self, message: str, *, peer: int | None = None, role: str | None = None, host: str | None = None):
        self.peer = peer
        self.role = role
        self.host = host
        if peer is not None:
            message = f"{message} [peer: {describe_peer(peer, role, host)}]"
        super().__init__(message)


class ProtocolError(TransportError):
    """A received message is malformed, truncated, oversized or of an unknown type.

    The receiver raises it instead of crashing; ``peer`` is the sender rank.
    """

    def __init__(self, message: str, *, sender: int | None = None, role: str | None = None, host: str | None = None):
        self.sender = sender
        super().__init__(f"malformed message from {describe_peer(sender, role, host)}: {message}")


class DeadlineError(TransportError, TimeoutError):
    """A blocking wait (receive, send completion, barrier, rate limiter) passed its deadline."""


class PeerLostError(GflowdistError):
    """A rank died or stopped sending heartbeats for longer than the configured timeout."""

    def __init__(
        self, rank: int, *, role: str | None = None, host: str | None = None, reason: str = "stopped responding"
    ):
        self.rank = rank
        self.role = role
        self.host = host
        self.reason = reason
        super().__init__(f"lost {describe_peer(rank, role, host)}: {reason}")


class LedgerError(GflowdistError):
    """The run-wide ledger does not balance: trajectories were lost or double counted."""


class CheckpointError(GflowdistError):
    """A checkpoint file cannot be written (the path and the OS reason) or read back intact.

    ``path`` is the file (or directory) concerned; the message names it and
    says what is wrong: no space left, permission denied, truncated, a
    checksum that differs from the manifest, contents that are not a
    checkpoint.
    """

    def __init__(self, message: str, *, path: str | None = None):
        self.path = path
        super().__init__(message)


class ReplayDivergence(GflowdistError):
    """A replayed run (``gflowdist replay``) stopped doing what the recorded run did.

    ``rank``, ``role`` and ``host`` say where, ``where`` at which step
    (``"step 12"``, ``"trajectory 40"``, ``"message 57"``), ``event`` what the
    recording holds there and what the replay did instead.
    """

    def __init__(self, rank: int, *, role: str | None = None, host: str | None = None, where: str, event: str):
        self.rank, self.role, self.host, self.where, self.event = rank, role, host, where, event
        super().__init__(f"replay diverged on {describe_peer(rank, role, host)} at {where}: {event}")


class BadBatchError(GflowdistError):
    """A buffer refused a client's batch: fields, per-item shapes or dtypes differ from what it stores.

    Raised on the sender (``faults.on_bad_batch: fail``); the message names the
    buffer, the sender, the field, what the buffer stores and what arrived.
    ``step`` is the trainer step that produced the batch (None for an actor's).
    """

    def __init__(self, message: str, *, step: int | None = None):
        self.step = step
        super().__init__(message)


class BatchError(GflowdistError, TypeError):
    """What a role's method returned is not a batch gflowdist can ship: a dict of tensors, one row per trajectory.

    Raised where the batch is made, before it is sent or concatenated. ``where``
    is the role class and method (``"HyperGridTrainer.rollout"``), ``key`` the
    field concerned (None when the whole value is wrong); the message names both.
    """

    def __init__(self, message: str, *, where: str, key: str | None = None):
        self.where, self.key = where, key
        super().__init__(message)


class NonFiniteLossError(GflowdistError):
    """A trainer's loss is NaN or infinite (``faults.on_nonfinite_loss: fail``); names the rank and the step."""
