"""The closed list of element types an array may have on the wire.

Every array frame carries a one-byte dtype code. The table below is the whole
wire vocabulary; a code outside it is a :class:`~gflowdist.errors.ProtocolError`
on decode and an :class:`~gflowdist.transport.values.EncodeError` on encode.

    code  name      bytes  numpy            torch
       1  bool          1  bool             torch.bool
       2  uint8         1  uint8            torch.uint8
       3  int8          1  int8             torch.int8
       4  int16         2  <i2              torch.int16
       5  int32         4  <i4              torch.int32
       6  int64         8  <i8              torch.int64
       7  float16       2  <f2              torch.float16
       8  bfloat16      2  (none: stored    torch.bfloat16
                            as <i2 bits)
       9  float32       4  <f4              torch.float32
      10  float64       8  <f8              torch.float64

Multi-byte elements are little-endian on the wire. A big-endian numpy input is
byte-swapped during its one copy into the message; decoded arrays are always
little-endian (native on every host gflowdist runs on).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

TorchDtype = torch.dtype  # the field named `torch` below shadows the module inside the class

__all__ = ["WireDtype", "WIRE_DTYPES", "SUPPORTED_DTYPES", "BY_CODE", "row_for_numpy", "row_for_torch"]


@dataclass(frozen=True, slots=True)
class WireDtype:
    """One row of the wire dtype table.

    ``storage`` is the numpy dtype whose bytes are the frame (for bfloat16 the
    raw 16-bit patterns as ``<i2``) and ``torch_storage`` the torch dtype of
    the same layout; ``numpy`` is ``None`` when numpy has no such type, so only
    a torch tensor may carry it.
    """

    code: int
    name: str
    itemsize: int
    storage: np.dtype
    numpy: np.dtype | None
    torch: TorchDtype
    torch_storage: TorchDtype


def _row(
    code: int, name: str, storage: str, torch_dtype: torch.dtype, *, bits_as: torch.dtype | None = None
) -> WireDtype:
    dtype = np.dtype(storage)
    numpy_dtype = None if bits_as is not None else dtype
    return WireDtype(code, name, dtype.itemsize, dtype, numpy_dtype, torch_dtype, bits_as or torch_dtype)


WIRE_DTYPES: tuple[WireDtype, ...] = (
    _row(1, "bool", "?", torch.bool),
    _row(2, "uint8", "u1", torch.uint8),
    _row(3, "int8", "i1", torch.int8),
    _row(4, "int16", "<i2", torch.int16),
    _row(5, "int32", "<i4", torch.int32),
    _row(6, "int64", "<i8", torch.int64),
    _row(7, "float16", "<f2", torch.float16),
    _row(8, "bfloat16", "<i2", torch.bfloat16, bits_as=torch.int16),
    _row(9, "float32", "<f4", torch.float32),
    _row(10, "float64", "<f8", torch.float64),
)

#: Names of the element types an array or tensor may have on the wire.
SUPPORTED_DTYPES: tuple[str, ...] = tuple(row.name for row in WIRE_DTYPES)

BY_CODE: dict[int, WireDtype] = {row.code: row for row in WIRE_DTYPES}
_BY_NUMPY: dict[np.dtype, WireDtype] = {row.numpy: row for row in WIRE_DTYPES if row.numpy is not None}
_BY_TORCH: dict[torch.dtype, WireDtype] = {row.torch: row for row in WIRE_DTYPES}


def row_for_numpy(dtype: np.dtype) -> WireDtype | None:
    """The wire row of a numpy dtype (either byte order), or ``None`` if it cannot travel."""
    row = _BY_NUMPY.get(dtype)
    if row is None and dtype.byteorder == ">":
        row = _BY_NUMPY.get(dtype.newbyteorder("<"))
    return row


def row_for_torch(dtype: torch.dtype) -> WireDtype | None:
    """The wire row of a torch dtype, or ``None`` if it cannot travel."""
    return _BY_TORCH.get(dtype)
