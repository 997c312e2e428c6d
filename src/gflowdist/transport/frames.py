"""Array frames: how a numpy array or torch tensor rides behind the msgpack header.

In the header an array is a msgpack extension value (ExtType) whose type code
says what to rebuild and whose data says where the bytes are:

    ext code 1 = numpy.ndarray, ext code 2 = torch.Tensor
    ext data   = struct "<BBQ" + ndim * "<q", little-endian, 10 + 8 * ndim bytes:
                 dtype code (see dtypes.py), ndim (<= MAX_NDIM), offset, shape[0..ndim)

``offset`` counts from the start of the data section (the first 64-byte
boundary after the header). Frames are laid out in the order their references
appear in the packed header, each starting at the next multiple of
FRAME_ALIGNMENT:

    offset[0]   = 0
    offset[i+1] = align(offset[i] + nbytes[i]),  align(n) = (n + 63) // 64 * 64
    nbytes[i]   = prod(shape[i]) * itemsize[i]    (C order, no strides on the wire)

Padding bytes are zero. The decoder accepts exactly this canonical layout, so
an overlap, a gap, a frame running past the message or bytes after the last
frame are all errors, and the layout needs no frame table of its own.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np
import torch

from gflowdist.errors import ProtocolError
from gflowdist.transport.dtypes import BY_CODE, WIRE_DTYPES, WireDtype, row_for_numpy, row_for_torch
from gflowdist.transport.values import EncodeError

__all__ = [
    "FRAME_ALIGNMENT",
    "MAX_NDIM",
    "EXT_NUMPY",
    "EXT_TORCH",
    "MAX_REF_BYTES",
    "align",
    "Frame",
    "FrameWriter",
    "FrameReader",
    "fill_message",
]

FRAME_ALIGNMENT = 64
#: Most dimensions an array may have on the wire.
MAX_NDIM = 32
EXT_NUMPY = 1
EXT_TORCH = 2

_REF_HEAD = struct.Struct("<BBQ")
_REFS = tuple(struct.Struct(f"<BBQ{ndim}q") for ndim in range(MAX_NDIM + 1))
_READ_REFS = tuple(struct.Struct(f"<BBQ{ndim}Q") for ndim in range(MAX_NDIM + 1))  # see _check_extent
#: Longest ext data an array reference can have (ndim = MAX_NDIM).
MAX_REF_BYTES = _REF_HEAD.size + 8 * MAX_NDIM
_ZEROS = bytes(FRAME_ALIGNMENT)
_NUMPY_ROWS = {row.numpy: row for row in WIRE_DTYPES if row.numpy is not None}


# ``_new_tuple(ExtType, (code, data))`` is ``msgpack.ExtType(code, data)`` without its Python-level
# type checks (a third of a microsecond per array): ExtType is a namedtuple and the fields are
# already an int and bytes wherever this is used.
_new_tuple = tuple.__new__
_ExtType = msgpack.ExtType


def align(n: int) -> int:
    """Round ``n`` up to a multiple of FRAME_ALIGNMENT."""
    return (n + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT


class FrameWriter:
    """The packer's ``default`` hook: turns arrays into references and remembers their sources.

    ``frames`` lists ``(source, row, shape, offset, nbytes)`` in packing order
    and ``end`` is where the last frame ends; :func:`fill_message` then copies
    every source exactly once into the message buffer. :meth:`take` hands the
    list over and empties the writer, so a reused writer holds no arrays.
    """

    __slots__ = ("end", "frames")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.end = 0

    def take(self) -> tuple[list[Frame], int]:
        """The frames collected so far and where they end; the writer starts empty again."""
        frames, end = self.frames, self.end
        self.frames, self.end = [], 0
        return frames, end

    def __call__(self, value: Any) -> Any:
        if type(value) is np.ndarray:  # the common case first: a plain array of a native wire dtype
            row = _NUMPY_ROWS.get(value.dtype)
            if row is not None:
                return self._reference(EXT_NUMPY, value, row, value.shape, value.nbytes, True)
        if isinstance(value, np.ndarray):
            if isinstance(value, np.ma.MaskedArray):
                raise EncodeError(
                    "a numpy masked array cannot travel (its mask would be lost); send .data and .mask as two arrays"
                )
            row = row_for_numpy(value.dtype)
            if row is None:
                raise EncodeError(
                    f"numpy dtype {value.dtype} cannot travel; supported: "
                    "bool, uint8, int8, int16, int32, int64, float16, float32, float64"
                )
            return self._reference(EXT_NUMPY, value, row, value.shape, value.nbytes)
        if isinstance(value, torch.Tensor):
            try:  # a plain CPU tensor of a numpy-compatible dtype: one call gives its bytes
                array = value.numpy()
            except (RuntimeError, TypeError):  # requires grad, not on the CPU, sparse, bfloat16, ...
                return self._tensor_reference(value)
            row = _NUMPY_ROWS.get(array.dtype)
            if row is None:
                return self._tensor_reference(value)
            return self._reference(EXT_TORCH, array, row, array.shape, array.nbytes, True)
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, int):  # msgpack asks its default hook about ints it cannot fit in 64 bits
            raise EncodeError(f"body holds the int {value}, outside [-2**63, 2**64)")
        raise EncodeError(f"a {type(value).__qualname__} cannot travel")

    def _tensor_reference(self, tensor: torch.Tensor) -> msgpack.ExtType:
        """The careful path for a tensor ``Tensor.numpy()`` refused or gave an unknown dtype."""
        if tensor.layout != torch.strided:
            raise EncodeError(f"a torch tensor with layout {tensor.layout} cannot travel; convert it with .to_dense()")
        row = row_for_torch(tensor.dtype)
        if row is None:
            raise EncodeError(
                f"torch dtype {tensor.dtype} cannot travel; supported: bool, uint8, int8, "
                "int16, int32, int64, float16, bfloat16, float32, float64"
            )
        if tensor.requires_grad:
            tensor = tensor.detach()
        if tensor.is_meta:
            raise EncodeError("a meta tensor has no data to send")
        if not tensor.is_cpu:  # torch copies device -> message buffer, still once
            return self._reference(EXT_TORCH, tensor, row, tuple(tensor.shape), tensor.numel() * row.itemsize)
        if tensor.is_neg():  # a lazy negation view (torch._neg_view) has no numpy form: materialise it
            tensor = tensor.resolve_neg()
        try:
            array = (tensor if row.numpy is not None else tensor.view(row.torch_storage)).numpy()
        except (RuntimeError, TypeError) as exc:
            raise EncodeError(
                f"a {type(tensor).__qualname__} of {row.name} cannot be read as plain memory: {exc}"
            ) from exc
        return self._reference(EXT_TORCH, array, row, array.shape, array.nbytes)

    def _reference(
        self, ext_code: int, data: Any, row: WireDtype, shape: tuple[int, ...], nbytes: int, native: bool = False
    ) -> msgpack.ExtType:
        """Record one frame and return its reference; ``native``: ``data`` is an ndarray of ``row.storage``."""
        ndim = len(shape)
        if ndim > MAX_NDIM:
            raise EncodeError(f"an array with {ndim} dimensions cannot travel (at most {MAX_NDIM})")
        offset = (self.end + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT if self.frames else 0
        if nbytes and (native or (type(data) is np.ndarray and data.dtype == row.storage)) and data.flags.c_contiguous:
            data = data.data.cast("B")  # already the frame's bytes: one memoryview assignment copies it
        self.frames.append((data, row, shape, offset, nbytes))
        self.end = offset + nbytes
        return _new_tuple(_ExtType, (ext_code, _REFS[ndim].pack(row.code, ndim, offset, *shape)))


Frame = tuple[Any, WireDtype, tuple[int, ...], int, int]


def fill_message(out: np.ndarray, header: bytes, header_start: int, data_start: int, frames: list[Frame]) -> None:
    """Fill ``out`` (a uint8 buffer whose prefix is already written) after the prefix.

    The header goes to ``[header_start, header_start + len(header))``, every
    frame ``(source, row, shape, offset, nbytes)`` to ``data_start + offset``
    with exactly one copy (a memoryview assignment for a contiguous source, an
    ``np.copyto`` into a view for a strided or byte-swapped one, a
    ``Tensor.copy_`` for a tensor not on the CPU), zeros to the padding.
    """
    fill = memoryview(out)
    header_end = header_start + len(header)
    fill[header_start:header_end] = header
    fill[header_end:data_start] = _ZEROS[: data_start - header_end]
    previous_end = data_start
    for data, row, shape, offset, nbytes in frames:
        start = data_start + offset
        if start != previous_end:
            fill[previous_end:start] = _ZEROS[: start - previous_end]
        if type(data) is memoryview:
            fill[start : start + nbytes] = data
        elif isinstance(data, np.ndarray):  # strided or byte-swapped source
            np.copyto(np.ndarray(shape, row.storage, out, start), data, casting="equiv")
        else:  # a tensor on another device
            target = torch.from_numpy(np.ndarray(shape, row.storage, out, start))
            target = target if row.numpy is not None else target.view(row.torch)
            target.copy_(data)
        previous_end = start + nbytes


class FrameReader:
    """The unpacker's ``ext_hook``: checks each array reference and returns a view of its frame.

    ``buffer`` is the whole message as a uint8 memoryview, ``data_start`` the
    absolute offset of the data section and ``data_len`` its length
    (``total - data_start``); ``count`` frames have been read so far, the last
    ending at ``end`` (relative to ``data_start``), so the next must start at
    ``next``. After unpacking,
    :meth:`finish` checks that the frames ended exactly at the end of the
    message.
    """

    __slots__ = (
        "buffer",
        "copy",
        "count",
        "data_len",
        "data_start",
        "end",
        "max_bytes",
        "next",
        "sender",
        "writable",
    )

    def __init__(
        self,
        buffer: memoryview,
        data_start: int,
        data_len: int,
        sender: int,
        copy: bool,
        writable: bool,
        max_bytes: int,
    ) -> None:
        self.buffer = buffer
        self.data_start = data_start
        self.data_len = data_len
        self.sender = sender
        self.copy = copy
        self.writable = writable
        self.max_bytes = max_bytes
        self.count = 0
        self.end = 0
        self.next = 0  # canonical offset of the next frame: align(end) once a frame was read

    def _fail(self, what: str) -> ProtocolError:
        return ProtocolError(f"array frame {self.count}: {what}", sender=self.sender)

    def __call__(self, ext_code: int, ref: bytes) -> Any:
        if ext_code != EXT_NUMPY and ext_code != EXT_TORCH:
            raise ProtocolError(
                f"unknown msgpack extension type {ext_code} in header "
                f"(arrays use {EXT_NUMPY} for numpy and {EXT_TORCH} for torch)",
                sender=self.sender,
            )
        try:
            fields = _READ_REFS[ref[1]].unpack(ref)
        except (IndexError, struct.error):
            raise self._bad_reference(ref) from None
        row = BY_CODE.get(fields[0])
        if row is None or (row.numpy is None and ext_code == EXT_NUMPY):
            raise self._bad_dtype(fields[0])
        offset = fields[2]
        if offset != self.next:
            relation = "overlaps the previous frame" if offset < self.next else "leaves a gap after the previous frame"
            raise self._fail(f"offset {offset} {relation}; the canonical offset is {self.next}")
        shape = fields[3:]
        end = offset + math.prod(shape) * row.itemsize
        if end > self.data_len or end == offset:
            self._check_extent(row, shape, offset, end)
        start = self.data_start + offset
        if offset != self.end:
            padding = self.buffer[self.data_start + self.end : start]
            if padding != _ZEROS[: len(padding)]:
                raise self._fail("padding before the frame is not zero")
        view = np.ndarray(shape, row.storage, self.buffer, start)
        self.count += 1
        self.end = end
        self.next = (end + FRAME_ALIGNMENT - 1) & -FRAME_ALIGNMENT
        if ext_code == EXT_NUMPY:
            return view.copy() if self.copy else view
        if self.copy or not self.writable:
            view = view.copy()  # torch has no read-only tensors: never alias an immutable buffer
        tensor = torch.from_numpy(view)
        return tensor if row.numpy is not None else tensor.view(row.torch)

    def _bad_dtype(self, code: int) -> ProtocolError:
        row = BY_CODE.get(code)
        if row is None:
            return self._fail(f"dtype code {code} is not a wire dtype (codes 1..{len(BY_CODE)})")
        return self._fail(f"{row.name} can only travel as a torch tensor, not a numpy array")

    def _bad_reference(self, ref: bytes) -> ProtocolError:
        """Say why ext data did not unpack as ``<BBQ`` + ndim int64s."""
        if len(ref) < _REF_HEAD.size:
            return self._fail(f"array reference of {len(ref)} bytes, shorter than its {_REF_HEAD.size}-byte head")
        ndim = ref[1]
        if ndim > MAX_NDIM:
            return self._fail(f"{ndim} dimensions (at most {MAX_NDIM})")
        return self._fail(
            f"array reference of {len(ref)} bytes, expected {_REF_HEAD.size + 8 * ndim} for {ndim} dimensions"
        )

    def _check_extent(self, row: WireDtype, shape: tuple[int, ...], offset: int, end: int) -> None:
        """The slow path of a frame that is empty or does not fit: name what is wrong, if anything.

        Dimensions are read as uint64, so a negative int64 shows up as a value
        >= 2**63 here; an empty array is still refused when its non-empty axes
        would exceed the message limit.
        """
        negative = [dim - (1 << 64) for dim in shape if dim >= 1 << 63]
        if negative:
            raise self._fail(
                f"negative dimension {negative[0]} in shape "
                f"{[dim - (1 << 64) if dim >= 1 << 63 else dim for dim in shape]}"
            )
        if end > self.data_len:
            raise self._fail(
                f"{row.name} {list(shape)} needs bytes [{offset}, {end}) of the data section, "
                f"which holds only {max(self.data_len, 0)} (truncated or lying header)"
            )
        if math.prod(dim for dim in shape if dim) * row.itemsize > self.max_bytes:
            raise self._fail(
                f"empty {row.name} array of shape {list(shape)} would exceed the "
                f"{self.max_bytes}-byte message limit if its empty axes were not"
            )

    def finish(self, header_end: int) -> None:
        """Check the frames filled the data section exactly and the padding after the header is zero."""
        if not self.count:
            raise ProtocolError("flags say array frames follow but the header references none", sender=self.sender)
        if self.end != self.data_len:
            raise ProtocolError(
                f"{self.data_len - self.end} bytes of trailing garbage after the last array frame", sender=self.sender
            )
        gap = self.buffer[header_end : self.data_start]
        if gap != _ZEROS[: len(gap)]:
            raise ProtocolError("padding between header and first frame is not zero", sender=self.sender)
