"""Transport: the wire codec (this package) and, on top of it, the channel.

The codec turns ``(type, body, sender, seq)`` into one contiguous uint8 buffer
and back; docs/wire-format.md gives the byte layout. Nothing here pickles.
"""

from __future__ import annotations

from gflowdist.transport.codec import (
    DEFAULT_MAX_MESSAGE_BYTES,
    FORMAT_VERSION,
    SUPPORTED_DTYPES,
    Message,
    MessageType,
    decode,
    encode,
)
from gflowdist.transport.frames import FRAME_ALIGNMENT, MAX_NDIM
from gflowdist.transport.values import MAX_NESTING_DEPTH, EncodeError

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "FORMAT_VERSION",
    "FRAME_ALIGNMENT",
    "MAX_NDIM",
    "MAX_NESTING_DEPTH",
    "SUPPORTED_DTYPES",
    "EncodeError",
    "Message",
    "MessageType",
    "decode",
    "encode",
]
