"""The protocol's four channels on a rank's world (data, control, weights, inference), built with one message size
limit.

Every message on them is defined in :mod:`gflowdist.runtime.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gflowdist.comm import Communicator
from gflowdist.runtime.observing import TraceObserver
from gflowdist.runtime.protocol import Tags
from gflowdist.runtime.settings import Settings
from gflowdist.timing.trace import TraceRecorder
from gflowdist.transport.channel import Channel

__all__ = ["Channels", "LIMIT_KEY"]

#: The config key of the one message size limit (senders and receivers): named in the sender's refusal.
LIMIT_KEY = "faults.max_message_bytes"

#: Unacknowledged sends per peer on the control and weights channels (the data channel's is replay.max_in_flight).
CONTROL_IN_FLIGHT = 64
WEIGHTS_IN_FLIGHT = 2
#: ... on the inference channel, beyond ``inference.split`` (an actor has that many requests out at a time, then its
#: ``done``; its inference rank one reply to each)
INFERENCE_IN_FLIGHT = 2


@dataclass(frozen=True)
class Channels:
    """The data, control, weights and inference channels of one rank (:class:`~gflowdist.runtime.protocol.Tags`)."""

    data: Channel
    control: Channel
    weights: Channel
    inference: Channel  # actors <-> their inference rank (layout.inference)

    @classmethod
    def open(cls, comm: Communicator, settings: Settings, trace: TraceRecorder | None = None) -> Channels:
        """The channels on ``comm``; with ``trace``, every message on them is on the trace too."""
        # One limit at both ends: the communicator refuses a bigger claimed size before allocating,
        # each channel's decode refuses a bigger message, and each channel's isend refuses to send one
        # (its EncodeError names LIMIT_KEY), so an oversized message never reaches the wire.
        limit = settings.max_message_bytes
        comm.max_recv_bytes = limit

        def channel(tag: int, max_in_flight: int) -> Channel:
            return Channel(
                comm,
                tag,
                max_in_flight=max_in_flight,
                max_message_bytes=limit,
                send_timeout=settings.send_timeout_s,
                limit_name=LIMIT_KEY,
            )

        channels = cls(
            data=channel(Tags.DATA, settings.max_in_flight),
            control=channel(Tags.CONTROL, CONTROL_IN_FLIGHT),
            weights=channel(Tags.WEIGHTS, WEIGHTS_IN_FLIGHT),
            inference=channel(Tags.INFERENCE, settings.inference_split + INFERENCE_IN_FLIGHT),
        )
        if trace is not None:
            observer = TraceObserver(trace)
            for ch in channels.all():
                ch.observer = observer
        return channels

    def all(self) -> tuple[Channel, Channel, Channel, Channel]:
        return (self.data, self.control, self.weights, self.inference)

    def forget(self, rank: int) -> None:
        """Drop what is pending to or from ``rank`` (a rank the run goes on without) on every channel."""
        for channel in self.all():
            channel.forget(rank)
