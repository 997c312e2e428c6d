"""Numpy views of tensors for engines that speak buffers (MPI).

Contiguous CPU tensors and arrays are used in place (no copy). CUDA tensors,
non-contiguous ones and bfloat16 (no numpy dtype) go through one staging copy
that is written back after an in-place collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["numpy_view", "like"]


def _noop() -> None:
    return None


def numpy_view(x: Any) -> tuple[np.ndarray, Callable[[], None]]:
    """``(array, write_back)``: a contiguous array holding ``x``'s data.

    Writing into ``array`` and then calling ``write_back()`` updates ``x``.
    """
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous:
            return x, _noop
        staged = np.ascontiguousarray(x)

        def write_back_array() -> None:
            x[...] = staged

        return staged, write_back_array
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type == "cpu" and t.is_contiguous() and t.dtype != torch.bfloat16:
            return t.numpy(), _noop
        staged_tensor = t.to(
            device="cpu",
            dtype=torch.float32 if t.dtype == torch.bfloat16 else t.dtype,
            memory_format=torch.contiguous_format,
            copy=True,
        )

        def write_back_tensor() -> None:
            t.copy_(staged_tensor)

        return staged_tensor.numpy(), write_back_tensor
    raise TypeError(f"collectives take torch tensors or numpy arrays, not {type(x).__name__}")


def like(template: Any, array: np.ndarray) -> Any:
    """``array`` converted to the kind (tensor / ndarray), device and dtype of ``template``."""
    if isinstance(template, torch.Tensor):
        out = torch.from_numpy(array)
        if out.dtype != template.dtype or out.device != template.device:
            out = out.to(device=template.device, dtype=template.dtype)
        return out
    return array
