"""Gradient and model averaging over a group, one collective per flat bucket, in place.

:class:`GradientAverager` keeps one persistent flat buffer per bucket
(:class:`~gflowdist.ops.buckets.GradBucket`; :func:`~gflowdist.ops.buckets.plan_buckets`
decides which parameters share one). A call

1. makes every local gradient live in its slot of the bucket (a missing
   gradient, ``None``, is written as zeros) and sets one *presence* slot per
   parameter at the end of the bucket to 1 or 0;
2. runs **one** in-place ``all_reduce(SUM)`` per bucket over the group of
   size ``n`` (*this* group's size, never the world's) and divides it by
   ``n`` (the bits of ``sum / n`` that Spinning Up, OmniSafe and torchgfn
   compute: a true division, or where ``n`` is a power of two the
   multiplication by the exact ``1/n``, which gives the same bits sooner):
   each gradient slot
   becomes ``g <- (1/n) sum_r g_r``, a missing gradient counting as zeros,
   and each presence slot ``c/n`` where ``c`` is the number of ranks that had
   that gradient (so it is positive exactly when some rank had one);
3. leaves the mean in every parameter's **own** ``.grad`` tensor: the same
   object the caller may hold (``held = [p.grad ...]``; afterwards
   ``held[i] is p.grad`` and holds the mean). Parameters without a local
   gradient get one when some rank had it; when no rank had it they keep
   ``grad = None`` on every rank.

Because the presence flags travel inside the same reduction, ranks agree on
which parameters have gradients without a second collective, and a rank
with a ``None`` gradient cannot desynchronise the others. One more slot, the
*rider*, carries a number of the caller's in the first bucket's reduction
(``average_gradients(..., rider=x)`` returns its mean over the group): an
agent group's stop vote travels there instead of in a collective of its own.

How a gradient comes to live in its slot without changing identity: its
values are copied into the slot and the *same tensor object* is re-pointed
at the slot's memory (``Tensor.set_``), so from then on backward
accumulates straight into the bucket (``zero_grad(set_to_none=False)``:
nothing is copied again). With torch's default ``zero_grad()`` the gradients
are set to None and backward creates fresh tensors; a post-accumulate-grad
hook on every parameter moves each one into its slot as backward produces
it (DDP's *gradient as bucket view*), so the call itself copies nothing and
costs one reduction. Gradients that cannot be moved (a view into another
buffer, e.g. a flat-buffer optimizer's; non-contiguous; part of a graph
with ``create_graph=True``) are copied in and the result copied back. A
gradient tensor that was moved into a slot and is still held after
``zero_grad()`` replaced it keeps its values (it gets its own memory when
the next gradient moves in).

In a world of one nothing is touched (the mean over one rank is the value),
and no hook is installed.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Iterable

import torch

from gflowdist.comm.base import Communicator, ReduceOp
from gflowdist.comm.native import Group
from gflowdist.ops.buckets import DEFAULT_BUCKET_CAP_BYTES, GradBucket, broadcast_tensors, plan_buckets, reduce_tensors
from gflowdist.ops.collectives import group_or_world

__all__ = ["GradientAverager", "average_gradients", "average_models", "sync_params", "parameters_of"]


def parameters_of(model: torch.nn.Module | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters of a module (``list(module.parameters())``), or the tensors of an iterable, as a list."""
    if isinstance(model, torch.nn.Module):
        found = _plain_module_parameters(model)
        return list(model.parameters()) if found is None else found
    if isinstance(model, torch.Tensor):
        return [model]
    return list(model)


_MODULE = torch.nn.Module


def _plain_module_parameters(root: torch.nn.Module) -> list[torch.Tensor] | None:
    """``list(root.parameters())`` read straight from the modules' dicts; None if a class customises the walk.

    The same pre-order walk with the same de-duplication as torch's
    ``named_parameters``, without building the names: a third of the time
    for a 100-tensor model, which every averaging call pays.
    """
    if type(root).parameters is not _MODULE.parameters or type(root).named_parameters is not _MODULE.named_parameters:
        return None
    params: list[torch.Tensor] = []
    seen_params: set[int] = set()
    seen_modules: set[int] = set()
    stack = [root]
    while stack:
        module = stack.pop()
        if module is None or id(module) in seen_modules:
            continue
        if type(module).named_modules is not _MODULE.named_modules:
            return None
        seen_modules.add(id(module))
        for p in module._parameters.values():
            if p is not None and id(p) not in seen_params:
                seen_params.add(id(p))
                params.append(p)
        stack.extend(child for child in reversed(list(module._modules.values())) if child is not None)
    return params


def _mover(bucket_ref: weakref.ref[GradBucket], index: int):
    """The post-accumulate-grad hook of one parameter: move a gradient backward created into its slot."""

    def move(param: torch.Tensor) -> None:
        bucket = bucket_ref()
        grad = param.grad
        if (
            bucket is not None
            and grad is not None
            and grad.layout is torch.strided
            and grad.data_ptr() != bucket.pointers[index]
        ):
            bucket.adopt(index, grad)

    return move


class _BucketSet:
    """The gradient buckets of one list of parameters, and the hooks that fill them during backward.

    Shared by every averager of the same parameters (one per group), so two
    groups never pull a gradient back and forth. The hooks are removed when
    the set is garbage (no averager uses it any more).
    """

    def __init__(self, params: list[torch.Tensor], cap_bytes: int):
        self.params = params
        self.buckets = [GradBucket([params[i] for i in members]) for members in plan_buckets(params, cap_bytes)]
        handles = [
            p.register_post_accumulate_grad_hook(_mover(weakref.ref(bucket), index))
            for bucket in self.buckets
            for index, p in enumerate(bucket.params)
            if p.is_leaf
        ]
        weakref.finalize(self, _remove_hooks, handles)


def _remove_hooks(handles: list) -> None:
    for handle in handles:
        handle.remove()


_BUCKET_SETS: weakref.WeakValueDictionary[tuple, _BucketSet] = weakref.WeakValueDictionary()


def _bucket_set(params: list[torch.Tensor], cap_bytes: int) -> _BucketSet:
    """The bucket set of exactly ``params`` (same objects, same order) and cap, made on first use."""
    key = (cap_bytes, *map(id, params))  # ids stay valid: a live set holds its parameters
    found = _BUCKET_SETS.get(key)
    if found is None:
        found = _BUCKET_SETS[key] = _BucketSet(params, cap_bytes)
    return found


class GradientAverager:
    """Averages the gradients of a fixed list of parameters over ``group`` (see module docstring).

    Parameters with ``requires_grad=False`` are left out. Every rank must
    pass parameters of the same shapes and dtypes in the same order; the
    first call checks this (one small exchange) and raises ``ValueError`` on
    every rank when they differ. From the first call on (in a job of more
    than one rank) the parameters carry the hook that moves fresh gradients
    into the buckets.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        group: Group | None = None,
        *,
        bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    ):
        self.params = [p for p in params if p.requires_grad]
        self.group = group_or_world(group)
        self.bucket_cap_bytes = bucket_cap_bytes
        self._buckets: _BucketSet | None = None
        self._checked = False

    def matches(self, params: list[torch.Tensor], group: Communicator) -> bool:
        """True when this averager serves exactly ``params`` (those requiring grad) on ``group``."""
        mine = [p for p in params if p.requires_grad]
        return (
            group is self.group
            and len(mine) == len(self.params)
            and all(a is b for a, b in zip(mine, self.params, strict=False))
        )

    def _check_layout(self) -> None:
        layout = repr([(tuple(p.shape), str(p.dtype)) for p in self.params]).encode()
        mine = zlib.crc32(layout).to_bytes(4, "big") + len(self.params).to_bytes(8, "big")
        seen = self.group.all_gather_bytes(mine)
        if any(other != mine for other in seen):
            differing = [r for r, other in enumerate(seen) if other != seen[0]]
            raise ValueError(
                f"gradient averaging: parameter shapes/dtypes differ between ranks of the group "
                f"(ranks {differing} differ from rank 0); every rank must average the same model"
            )
        self._checked = True

    def __call__(self, rider: float | None = None) -> float | None:
        """Average the gradients now (a collective: every rank of the group must call it).

        With ``rider``, that number travels in the first bucket's reduction and
        its mean over the group is returned (every rank must pass one, or none).
        None when nothing was reduced: a group of one, or no parameter needing
        a gradient.
        """
        comm = self.group
        if comm.size == 1 or not self.params:
            return None
        if not self._checked:
            self._check_layout()
        if self._buckets is None:
            self._buckets = _bucket_set(self.params, self.bucket_cap_bytes)
        size = comm.size
        # the originals' ``sum / n`` bits: torch's correctly rounded division (about half the time of
        # the engine's numpy one), which ``mul_(1 / n)`` would not give for n = 3, 5, ...; for n a power
        # of two ``1 / n`` is exact, so the multiplication gives those very bits, in about 3/4 of the time
        halves = size & (size - 1) == 0
        buckets = self._buckets.buckets
        if rider is not None:
            buckets[0].rider.fill_(rider)
        for bucket in buckets:
            missing, copied = bucket.fill()
            comm.all_reduce(bucket.flat, ReduceOp.SUM)
            if halves:
                bucket.flat.mul_(1.0 / size)
            else:
                bucket.flat.div_(size)
            bucket.write_back(missing, copied)
        return None if rider is None else float(buckets[0].rider.item())

    average = __call__


_AVERAGERS: weakref.WeakKeyDictionary[torch.nn.Module, list[GradientAverager]] = weakref.WeakKeyDictionary()


def average_gradients(
    model: torch.nn.Module | Iterable[torch.Tensor],
    group: Group | None = None,
    *,
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    rider: float | None = None,
) -> float | None:
    """Replace every gradient by its mean over ``group`` (see module docstring), in place.

    Each existing ``p.grad`` stays the same tensor and receives the mean.
    For a module, the flat buffers are kept between calls (one
    :class:`GradientAverager` per module and group, sharing the buffers);
    for a plain iterable of parameters they are rebuilt each call (keep a
    :class:`GradientAverager` yourself in a hot loop). ``rider``: a number
    that travels in the same reduction; its mean over the group is returned
    (None when nothing was reduced: a group of one, or no parameter needing a gradient).
    """
    comm = group_or_world(group)
    if comm.size == 1:
        return None
    params = parameters_of(model)
    if not isinstance(model, torch.nn.Module):
        return GradientAverager(params, comm, bucket_cap_bytes=bucket_cap_bytes)(rider)
    cached = _AVERAGERS.setdefault(model, [])
    for averager in cached:
        if averager.bucket_cap_bytes == bucket_cap_bytes and averager.matches(params, comm):
            return averager(rider)
    cached[:] = [a for a in cached if a.group is not comm]
    averager = GradientAverager(params, comm, bucket_cap_bytes=bucket_cap_bytes)
    cached.append(averager)
    return averager(rider)


def average_models(model: torch.nn.Module | Iterable[torch.Tensor], group: Group | None = None) -> None:
    """Replace every parameter by its mean over ``group`` (``(1/n) sum_r p_r``), in place.

    One reduction per bucket; ``n`` is the size of ``group``.
    """
    reduce_tensors([p.data for p in parameters_of(model)], ReduceOp.AVG, group_or_world(group))


def sync_params(model: torch.nn.Module | Iterable[torch.Tensor], group: Group | None = None, src: int = 0) -> None:
    """Overwrite every parameter with rank ``src``'s (of ``group``; 0 = its first member), in place."""
    broadcast_tensors([p.data for p in parameters_of(model)], src, group_or_world(group))
