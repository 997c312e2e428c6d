"""Encode and decode one gflowdist message: a msgpack header followed by raw array frames.

Byte layout of one message (all integers little-endian)::

    offset  size  field
         0     2  magic  b"GF"
         2     1  format version (FORMAT_VERSION)
         3     1  flags: bit 0 (FLAG_FRAMES) set iff array frames follow; other bits 0
         4     4  H = length of the msgpack header (uint32)
         8     8  T = length of the whole message (uint64)
        16     H  msgpack array [message type, sender rank, seq, body]
      16+H        zero padding up to D = align64(16 + H), only if FLAG_FRAMES
         D        array frames, see frames.py (64-byte aligned, canonical order)

``T`` is ``16 + H`` for a message without arrays, else ``D + end of last frame``.
FLAG_FRAMES lets the decoder of a frameless message skip setting up a frame
reader; an array reference in a message without the flag is an error.
Arrays inside ``body`` are msgpack ExtType references (frames.py); every
other body value is plain msgpack (values.py lists what may travel).

Costs: :func:`encode` packs the header once, allocates the message once and
copies each array exactly once into it (a memoryview assignment for a
contiguous array, ``np.copyto`` for a strided one, ``Tensor.copy_`` for a
tensor not on the CPU). :func:`decode` copies nothing: arrays and
tensors are views of ``buf`` (so ``buf`` must not be reused while they live),
except with ``copy=True``, and except a torch tensor decoded from a read-only
buffer such as ``bytes``, which is copied because torch has no read-only
tensors.

Safety: :func:`decode` checks every length against what arrived and against
``max_message_bytes`` before it creates anything of that size, unpacks the
header with msgpack's length limits set from ``H``, rejects containers nested
deeper than MAX_NESTING_DEPTH, and raises :class:`ProtocolError` naming the
sender for every malformed input; no other exception escapes it.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import numpy as np
import torch

from gflowdist.errors import ProtocolError
from gflowdist.transport.dtypes import SUPPORTED_DTYPES
from gflowdist.transport.frames import MAX_REF_BYTES, Frame, FrameReader, FrameWriter, align, fill_message
from gflowdist.transport.messages import MESSAGE_TYPES, Message, MessageType, build_message
from gflowdist.transport.values import EncodeError, check_body, check_received_body

__all__ = [
    "FORMAT_VERSION",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SUPPORTED_DTYPES",
    "PREFIX_BYTES",
    "MAGIC",
    "encode",
    "decode",
    "Message",
    "MessageType",
    "EncodeError",
]

#: Version of the byte layout; a message of another version is refused.
FORMAT_VERSION = 1
#: Largest message :func:`decode` accepts unless told otherwise: 1 GiB.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
MAGIC = b"GF"
_PREFIX = struct.Struct("<2sBBIQ")
#: Size of the fixed prefix before the msgpack header.
PREFIX_BYTES = _PREFIX.size
#: Flags bit: the message has array frames.
FLAG_FRAMES = 0x01
_MAX_HEADER_BYTES = (1 << 32) - 1
_MAX_SEQ = (1 << 64) - 1
_MAX_RANK = (1 << 31) - 1
_UNPACK_ERRORS = (ValueError, TypeError, OverflowError, struct.error, msgpack.UnpackException)
_UINT8 = np.dtype(np.uint8)


class _FramesNotFlagged(Exception):
    """Internal: an array reference appeared in a message whose flags say it has no frames."""


def _refuse_ext(ext_code: int, ref: bytes) -> Any:
    raise _FramesNotFlagged(ext_code)


class _ThreadPackers(threading.local):
    """This thread's reusable packers (a Packer owns a buffer, so threads must not share one).

    ``arrays`` sends arrays, tensors and numpy scalars to ``writer``, whose
    frames are taken (and the writer emptied) after every pack; ``busy``
    guards against re-entry (a hook that encodes gets a fresh writer).
    """

    def __init__(self) -> None:
        self.plain = msgpack.Packer(use_bin_type=True)
        self.writer = FrameWriter()
        self.arrays = msgpack.Packer(use_bin_type=True, default=self.writer)
        self.busy = False


_packers = _ThreadPackers()


def _pack_with_arrays(record: list[Any]) -> tuple[bytes, list[Frame], int]:
    """Pack ``record``, turning its arrays into references: (header, frames, end of last frame)."""
    packers = _packers
    if packers.busy:
        writer = FrameWriter()
        return (msgpack.packb(record, default=writer, use_bin_type=True), *writer.take())
    packers.busy = True
    try:
        header = packers.arrays.pack(record)
    finally:
        frames, end = packers.writer.take()  # also on failure: never keep the caller's arrays
        packers.busy = False
    return header, frames, end


def _check_int(name: str, value: Any, high: int) -> None:
    """Raise EncodeError unless ``value`` is an int (not a bool) in ``[0, high]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise EncodeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= high:
        raise EncodeError(f"{name} must be in [0, {high}], got {value}")


def encode(
    msg_type: MessageType | int, body: Any, *, sender: int, seq: int, alloc: Callable[[int], np.ndarray] | None = None
) -> np.ndarray:
    """Encode one message into a new contiguous uint8 array (header, then 64-byte aligned frames).

    ``alloc(n)``, when given, supplies the uint8 array of ``n`` bytes for a
    message with frames (e.g. a recycled send buffer); by default a new one.

    Raises :class:`EncodeError` (a :class:`~gflowdist.errors.TransportError`
    and ``ValueError``) if ``msg_type`` is not a :class:`MessageType`, ``sender``
    is not a rank in ``[0, 2**31)``, ``seq`` not in ``[0, 2**64)``, or the body
    holds something the wire does not carry (see values.py), naming where.
    """
    member = MESSAGE_TYPES.get(msg_type) if type(msg_type) is not bool else None
    if member is None:
        raise EncodeError(f"unknown message type {msg_type!r}; use a gflowdist.transport.MessageType")
    if type(sender) is not int or not 0 <= sender <= _MAX_RANK:
        _check_int("sender", sender, _MAX_RANK)
    if type(seq) is not int or not 0 <= seq <= _MAX_SEQ:
        _check_int("seq", seq, _MAX_SEQ)
    has_arrays = check_body(body)
    record = [member, sender, seq, body]  # an IntEnum member packs as its int
    try:
        if not has_arrays:
            header = _packers.plain.pack(record)
        else:
            header, frames, frames_end = _pack_with_arrays(record)
    except EncodeError:
        raise
    except OverflowError as exc:
        raise EncodeError(f"body holds an int outside [-2**63, 2**64): {exc}") from exc
    except (ValueError, TypeError) as exc:
        raise EncodeError(f"body could not be packed: {exc}") from exc
    header_len = len(header)
    if header_len > _MAX_HEADER_BYTES:
        raise EncodeError(
            f"header of {header_len} bytes exceeds the {_MAX_HEADER_BYTES}-byte limit; put bulk data in arrays"
        )
    header_end = PREFIX_BYTES + header_len
    if not has_arrays or not frames:  # numpy scalars only: no frames
        out = np.empty(header_end, np.uint8)
        _PREFIX.pack_into(out, 0, MAGIC, FORMAT_VERSION, 0, header_len, header_end)
        memoryview(out)[PREFIX_BYTES:] = header
        return out
    data_start = align(header_end)
    total = data_start + frames_end
    out = np.empty(total, np.uint8) if alloc is None else alloc(total)
    _PREFIX.pack_into(out, 0, MAGIC, FORMAT_VERSION, FLAG_FRAMES, header_len, total)
    fill_message(out, header, PREFIX_BYTES, data_start, frames)
    return out


def _byte_view(buf: Any, sender: int) -> tuple[memoryview, bool]:
    """``buf`` as a flat uint8 memoryview and whether it is writable."""
    kind = type(buf)
    if kind is np.ndarray and buf.dtype is _UINT8 and buf.ndim == 1 and buf.flags.c_contiguous:
        return memoryview(buf), buf.flags.writeable
    if kind is bytes:
        return memoryview(buf), False
    if kind is bytearray:
        return memoryview(buf), True
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ProtocolError(
                f"decode needs a 1-d contiguous uint8 array, got {buf.dtype} with shape "
                f"{buf.shape}{'' if buf.flags.c_contiguous else ' (not contiguous)'}",
                sender=sender,
            )
        return memoryview(buf), bool(buf.flags.writeable)
    if isinstance(buf, torch.Tensor):
        if buf.dtype != torch.uint8 or buf.dim() != 1 or buf.device.type != "cpu" or not buf.is_contiguous():
            raise ProtocolError(
                f"decode needs a 1-d contiguous uint8 CPU tensor, got {buf.dtype} with shape "
                f"{tuple(buf.shape)} on {buf.device}",
                sender=sender,
            )
        return memoryview(buf.numpy()), True
    if isinstance(buf, memoryview):
        if not buf.c_contiguous:
            raise ProtocolError("decode needs a contiguous memoryview", sender=sender)
        if buf.format != "B" or buf.ndim != 1:
            buf = buf.cast("B")
        return buf, not buf.readonly
    raise ProtocolError(
        f"decode needs bytes, bytearray, memoryview or a uint8 numpy array / CPU tensor, got {kind.__name__}",
        sender=sender,
    )


def decode(
    buf: Any,
    *,
    sender: int,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    copy: bool = False,
    expected_types: Iterable[MessageType] | None = None,
) -> Message:
    """Decode one message received from rank ``sender``.

    ``buf`` is bytes, bytearray, memoryview, a 1-d uint8 numpy array or a 1-d
    uint8 CPU torch tensor holding exactly one message. Arrays in the body
    are views of ``buf`` unless ``copy=True`` (see the module docstring).
    ``expected_types``, when given, lists the message types the caller can
    handle; any other type is refused.

    Raises :class:`ProtocolError` (``err.sender == sender``) for anything
    malformed: bad magic, version or flags; fewer or more bytes than the
    prefix declares; a message over ``max_message_bytes``; a header that is
    not msgpack, breaks msgpack's length limits, is not
    ``[type, sender, seq, body]``, names an unknown or unexpected type or
    another sender; a body nested deeper than MAX_NESTING_DEPTH or with
    non-str keys; an array reference with an unknown dtype, more than
    MAX_NDIM or negative dimensions, a frame outside the message,
    overlapping or out of canonical place, non-zero padding, or trailing bytes.
    """
    view, writable = _byte_view(buf, sender)
    size = view.nbytes
    if size > max_message_bytes:
        raise ProtocolError(f"message of {size} bytes exceeds the {max_message_bytes}-byte limit", sender=sender)
    if size < PREFIX_BYTES:
        raise ProtocolError(f"truncated: {size} bytes, shorter than the {PREFIX_BYTES}-byte prefix", sender=sender)
    magic, version, flags, header_len, total = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}, expected {MAGIC!r} (not a gflowdist message)", sender=sender)
    if version != FORMAT_VERSION:
        raise ProtocolError(f"format version {version}, this receiver speaks {FORMAT_VERSION}", sender=sender)
    if flags & ~FLAG_FRAMES:
        raise ProtocolError(f"flags byte is {flags:#04x}; only bit 0 (frames follow) is defined", sender=sender)
    if total > max_message_bytes:
        raise ProtocolError(f"header declares {total} bytes, over the {max_message_bytes}-byte limit", sender=sender)
    if total != size:
        if total > size:
            raise ProtocolError(f"truncated: header declares {total} bytes, {size} arrived", sender=sender)
        raise ProtocolError(
            f"{size - total} bytes of trailing garbage: header declares {total} bytes, {size} arrived", sender=sender
        )
    header_end = PREFIX_BYTES + header_len
    if header_end > total:
        raise ProtocolError(
            f"header declares a {header_len}-byte msgpack header but the message has only "
            f"{total - PREFIX_BYTES} bytes after the prefix",
            sender=sender,
        )
    reader: FrameReader | None
    ext_hook: Callable[[int, bytes], Any]
    if flags:
        data_start = align(header_end)
        reader = FrameReader(view, data_start, total - data_start, sender, copy, writable, max_message_bytes)
        ext_hook = reader
    else:
        if header_end != total:
            raise ProtocolError(
                f"{total - header_end} bytes of trailing garbage after the header of a message without array frames",
                sender=sender,
            )
        reader = None
        ext_hook = _refuse_ext
    try:
        record = msgpack.unpackb(
            view[PREFIX_BYTES:header_end],
            ext_hook=ext_hook,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=header_len,
            max_bin_len=header_len,
            max_array_len=header_len,
            max_map_len=header_len // 2,
            max_ext_len=MAX_REF_BYTES,
        )
    except ProtocolError:
        raise
    except _FramesNotFlagged as exc:
        raise ProtocolError(
            f"array reference (msgpack extension type {exc.args[0]}) in a message whose flags say it has no frames",
            sender=sender,
        ) from None
    except _UNPACK_ERRORS as exc:
        raise ProtocolError(f"msgpack header is invalid: {type(exc).__name__}: {exc}", sender=sender) from exc
    if type(record) is not list or len(record) != 4:
        raise ProtocolError("msgpack header is not the 4-element array [type, sender, seq, body]", sender=sender)
    type_value, header_sender, seq, body = record
    member = MESSAGE_TYPES.get(type_value) if type(type_value) is int else None
    if member is None:
        raise ProtocolError(f"unknown message type {type_value!r}", sender=sender)
    if expected_types is not None and member not in expected_types:
        raise ProtocolError(
            f"unexpected message type {member.name}; expected one of "
            f"{sorted(str(getattr(t, 'name', t)) for t in expected_types)}",
            sender=sender,
        )
    if type(header_sender) is not int or header_sender != sender:
        raise ProtocolError(
            f"header names sender {header_sender!r} but the transport delivered it from rank {sender}", sender=sender
        )
    if type(seq) is not int or seq < 0:
        raise ProtocolError(f"sequence number {seq!r} is not a non-negative int", sender=sender)
    check_received_body(body, sender)
    if reader is not None:
        reader.finish(header_end)
    return build_message(member, sender, seq, body)
