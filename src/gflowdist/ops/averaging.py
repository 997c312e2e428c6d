"""Gradient and model averaging over a group, one collective per flat bucket.

:class:`GradientAverager` owns one persistent flat buffer per bucket (see
:mod:`gflowdist.ops.buckets` for how parameters are bucketed). A call

1. puts every parameter's local gradient into its slot of the bucket (a
   missing gradient, ``None``, is written as zeros) and sets one *presence*
   slot per parameter at the end of the bucket to 1 or 0;
2. runs **one** in-place ``all_reduce(AVG)`` per bucket over the group of
   size ``n`` (*this* group's size, never the world's): each gradient slot
   becomes ``g <- (1/n) sum_r g_r``, a missing gradient counting as zeros,
   and each presence slot ``c/n`` where ``c`` is the number of ranks that had
   that gradient (so it is positive exactly when some rank had one);
3. makes each parameter's ``.grad`` a view of its slot, except parameters
   that no rank had a gradient for: they keep ``grad = None`` on every rank.

Because the presence flags travel inside the same reduction, ranks agree on
which parameters have gradients without a second collective, and a rank
with a ``None`` gradient cannot desynchronise the others.

Step 3 is what makes the steady state cheap: after the first call the
gradients *are* the bucket, so with ``optimizer.zero_grad(set_to_none=False)``
backward accumulates straight into it and the next call copies nothing. With
the default ``set_to_none=True`` backward makes fresh tensors, and step 1
copies them in with one multi-tensor copy (0.3-0.6 ms for 4 MB on the
benchmark machine, a third of the reduction itself or more; docs/ops.md).

In a world of one nothing is touched (the mean over one rank is the value).
"""

from __future__ import annotations

import weakref
import zlib
from typing import Iterable

import torch

from gflowdist.comm.base import Communicator, ReduceOp
from gflowdist.ops.buckets import DEFAULT_BUCKET_CAP_BYTES, broadcast_tensors, plan_buckets, reduce_tensors
from gflowdist.ops.collectives import group_or_world

__all__ = ["GradientAverager", "average_gradients", "average_models", "sync_params", "parameters_of"]


def parameters_of(model: torch.nn.Module | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters of a module, or the tensors of an iterable, as a list."""
    if isinstance(model, torch.nn.Module):
        return list(model.parameters())
    if isinstance(model, torch.Tensor):
        return [model]
    return list(model)


def _copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for every pair, in one multi-tensor kernel where torch has it."""
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(targets, sources)
    else:  # older torch: same result, one kernel launch per tensor
        for target, source in zip(targets, sources):
            target.copy_(source)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)


class _GradBucket:
    """One flat buffer: the gradient slots of some parameters, then one presence slot each."""

    __slots__ = ("params", "flat", "data", "presence", "views", "pointers")

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(numel + len(params), dtype=params[0].dtype, device=params[0].device)
        self.data = self.flat[:numel]
        self.presence = self.flat[numel:]
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.data[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.pointers = [v.data_ptr() for v in self.views]

    def fill(self) -> bool:
        """Step 1: local gradients into the slots, presence flags set; True when nothing was outside.

        "Nothing outside" means every gradient is present and already its
        slot's view: the steady state, where step 3 has nothing to do.
        """
        flags: list[float] = []
        outside: list[int] = []
        for index, (p, pointer) in enumerate(zip(self.params, self.pointers)):
            grad = p.grad
            if grad is None:
                flags.append(0.0)
                outside.append(index)
                continue
            if grad.is_sparse:
                raise TypeError("gradient averaging supports dense gradients only (a parameter has a sparse grad)")
            flags.append(1.0)
            if grad.data_ptr() != pointer:
                outside.append(index)
        if not outside:
            self.presence.fill_(1.0)
            return True
        sources, targets = [], []
        for index in outside:
            grad = self.params[index].grad
            if grad is None:
                self.views[index].zero_()
            else:
                sources.append(grad)
                targets.append(self.views[index])
        if sources:
            _copy_all(targets, sources)
        self.presence.copy_(torch.tensor(flags, dtype=self.flat.dtype))
        return False

    def publish(self) -> None:
        """Step 3: every parameter some rank had a gradient for gets its slot as ``.grad``."""
        for p, view, pointer, share in zip(self.params, self.views, self.pointers, self.presence.tolist()):
            if share > 0:
                grad = p.grad
                if grad is None or grad.data_ptr() != pointer:
                    p.grad = view


class GradientAverager:
    """Averages the gradients of a fixed list of parameters over ``group`` (see module docstring).

    Parameters with ``requires_grad=False`` are left out. Every rank must
    pass parameters of the same shapes and dtypes in the same order; the
    first call checks this (one small exchange) and raises ``ValueError`` on
    every rank when they differ.
    """

    def __init__(self, params: Iterable[torch.Tensor], group: Communicator | None = None, *,
                 bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES):
        self.params = [p for p in params if p.requires_grad]
        self.group = group_or_world(group)
        self.bucket_cap_bytes = bucket_cap_bytes
        self._buckets: list[_GradBucket] | None = None
        self._checked = False

    def matches(self, params: list[torch.Tensor], group: Communicator) -> bool:
        """True when this averager serves exactly ``params`` (those requiring grad) on ``group``."""
        mine = [p for p in params if p.requires_grad]
        return group is self.group and len(mine) == len(self.params) and \
            all(a is b for a, b in zip(mine, self.params))

    def _check_layout(self) -> None:
        layout = repr([(tuple(p.shape), str(p.dtype)) for p in self.params]).encode()
        mine = zlib.crc32(layout).to_bytes(4, "big") + len(self.params).to_bytes(8, "big")
        seen = self.group.all_gather_bytes(mine)
        if any(other != mine for other in seen):
            differing = [r for r, other in enumerate(seen) if other != seen[0]]
            raise ValueError(
                f"gradient averaging: parameter shapes/dtypes differ between ranks of the group "
                f"(ranks {differing} differ from rank 0); every rank must average the same model")
        self._checked = True

    def __call__(self) -> None:
        """Average the gradients now (a collective: every rank of the group must call it)."""
        comm = self.group
        if comm.size == 1 or not self.params:
            return
        if not self._checked:
            self._check_layout()
        if self._buckets is None:
            plan = plan_buckets(self.params, self.bucket_cap_bytes)
            self._buckets = [_GradBucket([self.params[i] for i in bucket]) for bucket in plan]
        for bucket in self._buckets:
            steady = bucket.fill()
            comm.all_reduce(bucket.flat, ReduceOp.AVG)
            if not steady:
                bucket.publish()

    average = __call__


_AVERAGERS: "weakref.WeakKeyDictionary[torch.nn.Module, list[GradientAverager]]" = weakref.WeakKeyDictionary()


def average_gradients(model: torch.nn.Module | Iterable[torch.Tensor], group: Communicator | None = None, *,
                      bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> None:
    """Replace every gradient by its mean over ``group`` (see module docstring), in place.

    For a module, the flat buffers are kept between calls (one
    :class:`GradientAverager` per module and group); for a plain iterable of
    parameters they are rebuilt each call (keep a :class:`GradientAverager`
    yourself in a hot loop).
    """
    comm = group_or_world(group)
    if comm.size == 1:
        return
    params = parameters_of(model)
    if not isinstance(model, torch.nn.Module):
        GradientAverager(params, comm, bucket_cap_bytes=bucket_cap_bytes)()
        return
    cached = _AVERAGERS.setdefault(model, [])
    for averager in cached:
        if averager.bucket_cap_bytes == bucket_cap_bytes and averager.matches(params, comm):
            averager()
            return
    cached[:] = [a for a in cached if a.group is not comm]
    averager = GradientAverager(params, comm, bucket_cap_bytes=bucket_cap_bytes)
    cached.append(averager)
    averager()


def average_models(model: torch.nn.Module | Iterable[torch.Tensor], group: Communicator | None = None) -> None:
    """Replace every parameter by its mean over ``group`` (``(1/n) sum_r p_r``), in place.

    One reduction per bucket; ``n`` is the size of ``group``.
    """
    reduce_tensors([p.data for p in parameters_of(model)], ReduceOp.AVG, group_or_world(group))


def sync_params(model: torch.nn.Module | Iterable[torch.Tensor], group: Communicator | None = None,
                src: int = 0) -> None:
    """Overwrite every parameter with rank ``src``'s (of ``group``; 0 = its first member), in place."""
    broadcast_tensors([p.data for p in parameters_of(model)], src, group_or_world(group))
