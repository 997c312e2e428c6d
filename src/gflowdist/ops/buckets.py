"""Flat buckets: many tensors moved by one collective instead of one each.

A collective costs a fixed latency plus bytes / bandwidth; reducing 100
small tensors one by one pays the latency 100 times. :func:`plan_buckets`
groups tensors by ``(dtype, device)`` (a collective has one dtype) and cuts
each group, in order, into buckets of at most ``cap_bytes`` (a single larger
tensor gets a bucket of its own). :func:`reduce_tensors` and
:func:`broadcast_tensors` then run one collective per bucket on a
concatenated copy and write the results back.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from gflowdist.comm.base import Communicator, ReduceOp, require_float_for_avg

__all__ = ["DEFAULT_BUCKET_CAP_BYTES", "GradBucket", "copy_all", "plan_buckets", "reduce_tensors", "broadcast_tensors"]

#: Largest bucket by default (bytes). MPI counts are 32-bit ints; this stays far below.
DEFAULT_BUCKET_CAP_BYTES = 128 << 20


def plan_buckets(tensors: Sequence[torch.Tensor], cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES) -> list[list[int]]:
    """Indices of ``tensors`` in buckets: same dtype and device, in order, at most ``cap_bytes`` each."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be a positive number of bytes, got {cap_bytes}")
    open_buckets: dict[tuple, tuple[list[int], int]] = {}
    closed: list[list[int]] = []
    for index, tensor in enumerate(tensors):
        key = (tensor.dtype, tensor.device)
        nbytes = tensor.numel() * tensor.element_size()
        members, used = open_buckets.get(key, ([], 0))
        if members and used + nbytes > cap_bytes:
            closed.append(members)
            members, used = [], 0
        members.append(index)
        open_buckets[key] = (members, used + nbytes)
    closed.extend(members for members, _ in open_buckets.values() if members)
    return sorted(closed, key=lambda bucket: bucket[0])


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _write_back(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        tensor.detach().copy_(flat[offset : offset + n].view_as(tensor))
        offset += n


def _each_bucket(tensors: Sequence[torch.Tensor], cap_bytes: int, collective: Callable[[torch.Tensor], object]) -> None:
    """Run ``collective`` in place on a flat copy of each bucket, then write the results back."""
    for bucket in plan_buckets(tensors, cap_bytes):
        members = [tensors[i] for i in bucket]
        flat = _flatten(members)
        collective(flat)
        _write_back(flat, members)


def reduce_tensors(
    tensors: Sequence[torch.Tensor], op: ReduceOp, group: Communicator, cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
) -> None:
    """Reduce every tensor over ``group`` in place, one collective per bucket.

    ``ReduceOp.AVG`` refuses integer tensors with ``TypeError`` before any
    communication. The bucket plan depends only on the tensors' dtypes,
    devices and sizes, so it is the same on every rank whose tensors have the
    same layout.
    """
    if op is ReduceOp.AVG:
        for tensor in tensors:  # refuse before any rank starts a collective
            require_float_for_avg(tensor)
    if group.size > 1:
        _each_bucket(tensors, cap_bytes, lambda flat: group.all_reduce(flat, op))


def broadcast_tensors(
    tensors: Sequence[torch.Tensor], src: int, group: Communicator, cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
) -> None:
    """Overwrite every tensor with rank ``src``'s, in place, one broadcast per bucket."""
    if group.size > 1:
        _each_bucket(tensors, cap_bytes, lambda flat: group.broadcast(flat, src))


# -- gradient buckets ---------------------------------------------------------------------


def _grad(param: torch.Tensor) -> torch.Tensor:
    """``param.grad`` of a parameter known to have one (it was moved or copied into a slot)."""
    if param.grad is None:
        raise RuntimeError(f"a parameter of shape {tuple(param.shape)} lost its gradient during averaging")
    return param.grad


def copy_all(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """``t.copy_(s)`` for every pair, in one multi-tensor kernel where torch has it."""
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(targets, sources)
    else:  # older torch: same result, one kernel launch per tensor
        for target, source in zip(targets, sources, strict=False):
            target.copy_(source)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)
_STRIDED = torch.strided


def _movable(grad: torch.Tensor, slot: torch.Tensor) -> bool:
    """True when ``grad`` may be re-pointed at ``slot`` with ``set_`` without anyone noticing.

    A dense contiguous tensor of the slot's dtype and device that owns its
    whole storage (not a slice of someone else's buffer, such as a
    flat-buffer optimizer's) and is outside the autograd graph.
    """
    return (
        grad.layout is _STRIDED
        and not grad.requires_grad
        and grad.dtype == slot.dtype
        and grad.device == slot.device
        and grad._base is None
        and grad.is_contiguous()
        and grad.untyped_storage().nbytes() == grad.numel() * grad.element_size()
    )


class GradBucket:
    """One flat buffer: a slot for each parameter's gradient, then one presence flag each, then a rider.

    A gradient *lives in* its slot when its data is the slot's memory. The
    bucket moves gradients there while keeping every tensor object
    (:meth:`adopt`): it copies the values into the slot and re-points the
    same tensor at the slot with ``Tensor.set_``. A gradient that cannot be
    moved (a view of another buffer, non-contiguous, part of a graph) is
    copied in before the reduction and the result copied back into it
    (:meth:`fill` / :meth:`write_back`). Either way ``p.grad`` stays the
    object it was.
    """

    __slots__ = ("__weakref__", "flat", "occupants", "offsets", "params", "pointers", "presence", "rider", "slots")

    def __init__(self, params: list[torch.Tensor]):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(numel + len(params) + 1, dtype=params[0].dtype, device=params[0].device)
        self.presence = self.flat[numel : numel + len(params)]
        #: one number that travels in the same reduction (the caller's, e.g. an agent group's stop vote)
        self.rider = self.flat[numel + len(params) :]
        self.slots, self.offsets, offset = [], [], 0
        for p in params:
            self.slots.append(self.flat[offset : offset + p.numel()].view(p.shape))
            self.offsets.append(offset)
            offset += p.numel()
        self.pointers = [slot.data_ptr() for slot in self.slots]
        #: the tensor last moved into each slot (weakly): it gets its own copy if a new one moves in
        self.occupants: list = [None] * len(params)

    def adopt(self, index: int, grad: torch.Tensor) -> bool:
        """Move ``grad`` (parameter ``index``'s gradient) into its slot, same object; False if it cannot."""
        slot = self.slots[index]
        if not _movable(grad, slot):
            return False
        self._evict(index)
        slot.copy_(grad)
        self._point(index, grad)
        return True

    def _point(self, index: int, grad: torch.Tensor) -> None:
        slot = self.slots[index]
        grad.set_(self.flat.untyped_storage(), self.offsets[index], slot.shape, slot.stride())
        self.occupants[index] = weakref.ref(grad)

    def _evict(self, index: int) -> None:
        """A tensor that lived in the slot and is still held elsewhere keeps its values in its own memory.

        (Torch semantics: after ``zero_grad()`` set a gradient to None, a
        reference kept to the old gradient still reads the old values.)
        """
        ref = self.occupants[index]
        old = ref() if ref is not None else None
        if old is not None and old.data_ptr() == self.pointers[index]:
            old.set_(old.clone())
        self.occupants[index] = None

    def fill(self) -> tuple[bool, list[int]]:
        """Before the reduction: every local gradient in its slot, presence flags set.

        Returns ``(missing, copied)``: whether some parameter had no gradient
        here, and the indices of gradients that were copied in and must get
        the result back (:meth:`write_back`).
        """
        grads = [p.grad for p in self.params]
        if (
            all(g is not None and g.layout is _STRIDED for g in grads)
            and [g.data_ptr() for g in grads if g is not None] == self.pointers
        ):
            self.presence.fill_(1.0)  # the steady state: every gradient already lives in its slot
            return False, []
        flags: list[float] = []
        movers: list[int] = []
        copied: list[int] = []
        for index, (p, pointer) in enumerate(zip(self.params, self.pointers, strict=False)):
            grad = p.grad
            if grad is None:
                flags.append(0.0)
                self._evict(index)
                self.slots[index].zero_()
                continue
            flags.append(1.0)
            if grad.layout is not _STRIDED:
                raise TypeError(
                    f"gradient averaging supports dense gradients only (a parameter of shape "
                    f"{tuple(grad.shape)} has a {grad.layout} gradient)"
                )
            if grad.data_ptr() == pointer:
                continue
            (movers if _movable(grad, self.slots[index]) else copied).append(index)
        if movers or copied:
            for index in movers:
                self._evict(index)
            both = movers + copied
            copy_all([self.slots[i] for i in both], [_grad(self.params[i]) for i in both])
            for index in movers:
                self._point(index, _grad(self.params[index]))
        missing = len(flags) - int(sum(flags))
        if missing:
            self.presence.copy_(torch.tensor(flags, dtype=self.flat.dtype))
        else:
            self.presence.fill_(1.0)
        return bool(missing), copied

    def write_back(self, missing: bool, copied: list[int]) -> None:
        """After the reduction: results into the gradients that were copied in; missing ones get their slot.

        A parameter without a local gradient gets its slot as ``.grad`` when
        some rank had one (presence flag > 0), and stays None otherwise.
        """
        if copied:
            copy_all([_grad(self.params[i]) for i in copied], [self.slots[i] for i in copied])
        if missing:
            for index, share in enumerate(self.presence.tolist()):
                p = self.params[index]
                if share > 0 and p.grad is None:
                    grad = torch.empty(0, dtype=self.flat.dtype, device=self.flat.device)
                    self._point(index, grad)  # a tensor of its own on the slot's memory, not a view
                    p.grad = grad
