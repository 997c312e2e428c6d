"""A trainer's data path to and from its device: batches in through host staging, weights out once per publish.

Three pieces, each usable (and tested) on the CPU:

* :class:`BatchStager` moves the host tensors of a batch (replayed items, always
  received into host memory; fresh ones a rollout made on the CPU) to the
  trainer's device. On a GPU each field is, by default, copied to the device
  in one copy on a side stream: the host waits for its own copy (a pageable
  source is copied through the driver's pipelined staging buffers), while
  the GPU goes on with the previous step's kernels (nothing in the loop
  synchronises the device between the two). The step's compute stream waits
  for the copy (``wait_stream``) before it uses the tensors.
  ``pin_memory=True`` instead copies each field into a reused *pinned* host
  buffer first and then to the device with ``non_blocking=True``; the
  buffers rotate over ``slots`` sets, and a set is reused only once its last
  copy has left it (its event). Measured on an H200 (benchmarks/gpu.py,
  2026-11-29), that path moved a 16 MiB batch at 0.60x the rate of one
  direct copy: the host's copy into pinned memory costs more than the
  driver's pipelined one, so it is the opt-in, not the default (it pays
  where the source is already pinned, which replayed items are not).
  ``pin_memory=False`` stages through pageable buffers (what the benchmark
  compares against); ``copy_on_cpu=True`` runs the same paths with the CPU
  in the GPU's place (tests, ``benchmarks/gpu.py --device cpu``).
  Tensors already on the device pass through.
* :class:`HostWeights` copies a model's weights off its device once per
  publish, into reused (pinned) host buffers, and hands the same host copy
  to every receiver (actors, the coordinator): one device-to-host copy per
  publish, not one per receiver. The channel's ``isend`` encodes at once, so
  the buffers may be overwritten by the next publish.
* :class:`DevicePath`, the trainer loop's one hook object: the two above,
  the first step's check that every parameter lives on the trainer's device
  (:func:`check_model_device`) and the naming of a device out-of-memory error
  (:func:`naming_out_of_memory`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from gflowdist.errors import GflowdistError
from gflowdist.timing import StepTimer

__all__ = [
    "BatchStager",
    "HostWeights",
    "DevicePath",
    "DeviceMemoryError",
    "check_model_device",
    "naming_out_of_memory",
    "on_device",
]


class DeviceMemoryError(GflowdistError):
    """A trainer's device ran out of memory (names the rank, the step and the batch size)."""


def on_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Whether a tensor on ``tensor_device`` lives on ``device`` (``cuda`` without an index: the current GPU)."""
    if tensor_device.type != device.type:
        return False
    if device.index is None or tensor_device.index is None:
        return device.type != "cuda" or (tensor_device.index or 0) == (device.index or torch.cuda.current_device())
    return tensor_device.index == device.index


def _pinnable(pin_memory: bool) -> bool:
    if pin_memory and not torch.cuda.is_available():
        raise GflowdistError("pinned staging needs CUDA (torch sees no GPU): stage with pin_memory=False")
    return pin_memory


class _Buffers:
    """Host buffers by field name, reused while their dtype matches and they are big enough."""

    def __init__(self, pin_memory: bool):
        self.pin_memory = pin_memory
        self.flat: dict[str, torch.Tensor] = {}
        self.allocations = 0

    def take(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """A host tensor of ``like``'s shape and dtype (a view of the reused buffer of ``name``)."""
        flat = self.flat.get(name)
        numel = like.numel()
        if flat is None or flat.dtype != like.dtype or flat.numel() < numel:
            flat = torch.empty(max(numel, 1), dtype=like.dtype, pin_memory=self.pin_memory)
            self.flat[name] = flat
            self.allocations += 1
        return flat[:numel].view(like.shape)


class BatchStager:
    """Host tensors of a batch to ``device``: one copy each, or through reused (pinned) host buffers (module doc)."""

    def __init__(
        self, device: str | torch.device, *, pin_memory: bool | None = None, copy_on_cpu: bool = False, slots: int = 2
    ):
        self.device = torch.device(device)
        on_cuda = self.device.type == "cuda"
        self.pin_memory = _pinnable(bool(pin_memory))
        #: one copy per field straight to the device (the default), not through host buffers
        self.direct = pin_memory is None and (on_cuda or copy_on_cpu)
        #: whether host tensors are staged at all (on the CPU they are used as they are, unless copy_on_cpu)
        self.active = on_cuda or copy_on_cpu
        # torch.cuda.Stream's and Event's constructors carry no annotations (torch 2.13): the calls are untyped
        self.stream = torch.cuda.Stream(self.device) if on_cuda else None  # type: ignore[no-untyped-call]
        self.slots = [_Buffers(self.pin_memory) for _ in range(max(1, slots))]
        self._copied: list[Any] = [None] * len(self.slots)  # the event of each slot's last copy out
        self._next = 0
        self.batches = 0  # batches that had something to stage
        self.bytes = 0  # bytes staged so far

    def stage(self, batch: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``batch`` with its host tensors on the device (fresh tensors; the others as they are)."""
        if batch is None or not self.active:
            return None if batch is None else dict(batch)
        host = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor) and v.device.type == "cpu"}
        if not host:
            return dict(batch)
        out = dict(batch)
        stream = torch.cuda.stream(self.stream) if self.stream is not None else _nothing()
        if self.direct:
            with stream:
                for name, tensor in host.items():
                    # a pageable source is free again once the call returns (the driver staged it);
                    # a pinned one only once its copy is done, so that copy is waited for
                    out[name] = tensor.to(self.device, non_blocking=not tensor.is_pinned(), copy=True)
                    self.bytes += tensor.numel() * tensor.element_size()
        else:
            index = self._next
            self._next = (index + 1) % len(self.slots)
            if self._copied[index] is not None:
                self._copied[index].synchronize()  # the slot's previous copy to the device has left it
            buffers = self.slots[index]
            with stream:
                for name, tensor in host.items():
                    staged = buffers.take(name, tensor)
                    staged.copy_(tensor)
                    out[name] = staged.to(self.device, non_blocking=self.pin_memory, copy=True)
                    self.bytes += tensor.numel() * tensor.element_size()
            if self.stream is not None:
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch (above)
                event.record(self.stream)
                self._copied[index] = event
        if self.stream is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.stream)  # the step's kernels start once the copy is in
            for name in host:
                out[name].record_stream(compute)  # its memory is not reused before the step is done with it
        self.batches += 1
        return out


class HostWeights:
    """A model's weights on the host, copied off its device once per ``version`` into reused buffers."""

    def __init__(self, *, pin_memory: bool | None = None, copy_on_cpu: bool = False):
        self.pin_memory = pin_memory
        self.copy_on_cpu = copy_on_cpu
        self.buffers: _Buffers | None = None
        self.copies = 0  # device-to-host copies of the whole model made so far
        self._version: int | None = None
        self._weights: dict[str, torch.Tensor] | None = None

    def snapshot(self, model: torch.nn.Module, version: int | None = None) -> dict[str, torch.Tensor]:
        """The model's ``state_dict`` in host memory; the same copy again while ``version`` is unchanged.

        Tensors already on the CPU are handed as they are (detached), unless ``copy_on_cpu``.
        The returned tensors are overwritten by the next snapshot of another version.
        """
        if version is not None and version == self._version and self._weights is not None:
            return self._weights
        state = {k: v.detach() for k, v in model.state_dict().items()}
        off_host = [v for v in state.values() if v.device.type != "cpu"]
        if not off_host and not self.copy_on_cpu:
            weights = state
        else:
            if self.buffers is None:
                pin = bool(off_host) and off_host[0].device.type == "cuda"
                self.buffers = _Buffers(_pinnable(pin if self.pin_memory is None else self.pin_memory))
            pinned = self.buffers.pin_memory
            weights = {}
            for name, tensor in state.items():
                host = self.buffers.take(name, tensor)
                host.copy_(tensor, non_blocking=pinned and tensor.device.type == "cuda")
                weights[name] = host
            if pinned:
                torch.cuda.current_stream(off_host[0].device).synchronize()  # the values are needed now
            self.copies += 1
        self._version, self._weights = version, weights
        return weights


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def check_model_device(model: torch.nn.Module, device: str | torch.device, *, owner: str) -> None:
    """Raise naming the first parameter (or buffer) of ``model`` that is not on ``device``.

    ``owner`` says whose model it is (``"ApexLearner.model of trainer rank 0"``).
    """
    want = torch.device(device)
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            if not on_device(tensor.device, want):
                raise GflowdistError(
                    f"{owner}: {kind} {name!r} is on {tensor.device}, but the trainer computes on {want}: "
                    f"build the model on self.device (or call .to(self.device)) in setup(), "
                    f"before the optimizer is made"
                )


def _is_out_of_memory(err: BaseException) -> bool:
    kind = getattr(torch, "OutOfMemoryError", None)
    return (kind is not None and isinstance(err, kind)) or "out of memory" in str(err).lower()


@contextmanager
def naming_out_of_memory(rank: int, step: int, batch_size: int, device: str | torch.device) -> Iterator[None]:
    """Turn an out-of-memory error of the device into one naming the rank, the step and the batch size."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:
        if not _is_out_of_memory(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DeviceMemoryError(
            f"trainer rank {rank} ran out of memory on {device} at step {step} with a batch of "
            f"{batch_size} items ({first}); a smaller batch (replay.learner_batch, the rollout's size) "
            f"or model, or a device of its own, would fit"
        ) from err


class DevicePath:
    """What a trainer loop needs for its device: batches in, weights out, the model's place, memory errors."""

    def __init__(
        self,
        device: str | torch.device,
        *,
        pin_memory: bool | None = None,
        copy_on_cpu: bool = False,
        timer: StepTimer | None = None,
    ):
        self.device = torch.device(device)
        self.timer = timer
        self.batches = BatchStager(self.device, pin_memory=pin_memory, copy_on_cpu=copy_on_cpu)
        self.weights = HostWeights(pin_memory=pin_memory, copy_on_cpu=copy_on_cpu)
        self.checked = False

    def stage(self, batch: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``batch`` on my device (:meth:`BatchStager.stage`), timed as the phase ``stage`` where it copies."""
        if batch is None or not self.batches.active or self.timer is None:
            return self.batches.stage(batch)
        with self.timer.phase("stage"):
            return self.batches.stage(batch)

    def host_weights(self, model: torch.nn.Module, version: int) -> dict[str, torch.Tensor]:
        return self.weights.snapshot(model, version)

    def check_once(self, trainer: Any, rank: int) -> None:
        """At the first step: every parameter of ``trainer.model`` on the trainer's device."""
        if self.checked:
            return
        self.checked = True
        model = getattr(trainer, "model", None)
        if isinstance(model, torch.nn.Module):
            check_model_device(model, self.device, owner=f"{type(trainer).__name__}.model of trainer rank {rank}")

    def out_of_memory(self, rank: int, step: int, batch: Mapping[str, Any]) -> Any:
        """A context naming an out-of-memory error with ``rank``, ``step`` and ``batch``'s size."""
        return naming_out_of_memory(rank, step, _batch_size(batch), self.device)


def _batch_size(batch: Mapping[str, Any]) -> int:
    sizes = [int(v.shape[0]) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return max(sizes) if sizes else 0
