"""Averages tensor by tensor, as OmniSafe and torchgfn reduce, where one flat buffer would change the bits.

Private helper of the compat modules. gflowdist averages gradients and
models in one flat reduction per bucket (:mod:`gflowdist.ops.averaging`).
On MPICH, and on any engine with two ranks, that gives the same bits as the
originals' one all-reduce per parameter; on gloo with three or more ranks it
does not (see :func:`needs_per_tensor`), so there the compat modules reduce
each tensor on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.engines import TORCH

__all__ = ["needs_per_tensor", "average_each"]


def needs_per_tensor(comm: Any) -> bool:
    """True where one flat reduction would not give the originals' bits: gloo's ring over 3+ ranks.

    The ring sums each chunk starting at a different rank, so an element's
    sum order depends on its offset in the buffer; only a reduction of each
    tensor on its own reproduces the originals' per-parameter all-reduces.
    (MPICH's algorithms pair ranks alike for every element, and two ranks
    sum ``a + b`` either way: there one flat reduction gives the same bits.)
    """
    return comm.engine == TORCH.name and comm.size > 2


def average_each(
    tensors: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor], comm: Any
) -> list[torch.Tensor | None]:
    """The originals' per-tensor ``t <- all_reduce(t) / n``, in place; a rank's missing tensor counts as zeros.

    One small reduction of presence flags first, so the ranks agree on which
    tensors exist (OmniSafe skips a ``None`` gradient on that rank alone, torchgfn
    crashes). Returns the tensors, a zero-filled new one where this rank had None.
    """
    present = torch.tensor([t is not None for t in tensors], dtype=torch.float32)
    comm.all_reduce(present, ReduceOp.SUM)
    out: list[torch.Tensor | None] = []
    for t, p, flag in zip(tensors, params, present.tolist(), strict=True):
        if flag == 0:
            out.append(t)
            continue
        t = torch.zeros_like(p) if t is None else t
        comm.all_reduce(t.data, ReduceOp.SUM)
        t.data.div_(comm.size)
        out.append(t)
    return out
