"""The torch.distributed engine's collectives (gloo on CPU; nccl for CUDA tensors).

:class:`TorchCollectives` is the half of :class:`~gflowdist.comm.torch_dist.TorchComm`
that runs over the group's collectives: barrier, reductions, gathers,
broadcast, and the byte gathers that always run on the group's gloo twin (its
``p2p`` group, made beside an nccl group when needed). Each collective is started
asynchronously and waited for by polling when the communicator's wait hook or a
timeout asks for it, so heartbeats go on during a long one. Point-to-point traffic, its threads and the communicator's
lifetime are :class:`~gflowdist.comm.torch_dist.TorchComm`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from gflowdist.comm.base import Communicator, ReduceOp, require_float_for_avg
from gflowdist.engines import TORCH

__all__ = ["TorchCollectives"]

_OPS = {
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.AVG: dist.ReduceOp.SUM,
}

#: the dtypes a crowded machine's all-reduce takes (NumPy's numbers; not bfloat16, bool or complex)
_HOST_DTYPES = {
    torch.float16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
}


class TorchCollectives(Communicator):
    """The collectives of a communicator over a torch.distributed process group (None: the default group)."""

    engine = TORCH.name

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        p2p_group: dist.ProcessGroup | None = None,
        is_world: bool | None = None,
    ):
        if not dist.is_initialized():
            raise RuntimeError("TorchComm needs an initialised torch.distributed process group")
        self._group = group
        self._is_world = group is None if is_world is None else is_world
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = dist.get_backend(group)
        if p2p_group is None:
            p2p_group = (
                group
                if self.backend == "gloo"
                else dist.new_group(dist.get_process_group_ranks(group) if group is not None else None, backend="gloo")
            )
        #: the gloo group that carries bytes (the group itself on gloo; None once freed)
        self._p2p: dist.ProcessGroup | None = p2p_group

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        return self._group

    def world_rank(self, rank: int) -> int:
        return rank if self._group is None else dist.get_global_rank(self._group, rank)

    # -- collectives ------------------------------------------------------------
    def _device_for(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "nccl" and x.device.type != "cuda":
            raise ValueError("this communicator's backend is nccl: collectives need CUDA tensors")
        return x

    def _on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """On an nccl group, a CPU tensor goes to this rank's GPU (a small value: a stop vote, a count);
        the caller copies the result back (it is another tensor)."""
        if self.backend == "nccl" and tensor.device.type == "cpu":
            return tensor.to(f"cuda:{torch.cuda.current_device()}")
        return tensor

    def _finish(
        self, work: Any, what: str, tensor: torch.Tensor | None, factor: int = 1, timeout: float | None = None
    ) -> None:
        """Wait for an async collective by polling (hook between checks), then surface its errors."""
        if self.wait_hook is not None or timeout is not None:
            nbytes = tensor.numel() * tensor.element_size() * factor if tensor is not None else 0
            self._await(work.is_completed, what, nbytes, timeout)
        work.wait()

    def barrier(self, timeout: float | None = None) -> None:
        work = dist.barrier(group=self._group, async_op=True)
        self._finish(work, "barrier", None, timeout=timeout)

    def all_reduce(self, x: Any, op: ReduceOp = ReduceOp.SUM, *, inplace: bool = True) -> Any:
        if op is ReduceOp.AVG:
            require_float_for_avg(x)
        is_array = isinstance(x, np.ndarray)
        if not inplace:
            x = np.array(x, copy=True) if is_array else x.clone()
        tensor = torch.from_numpy(x) if is_array else x
        staged = self._on_device(tensor if tensor.is_contiguous() else tensor.contiguous())
        # a crowded machine's gloo group reduces CPU numbers through shared memory (gflowdist.comm.host_reduce)
        on_cpu = self._host is not False and self.backend == "gloo" and staged.is_cpu and staged.dtype in _HOST_DTYPES
        flat = staged.detach().view(-1).numpy() if on_cpu else None
        host = self._host_reduce_for(flat) if flat is not None else None
        if host is not None and flat is not None:
            self._reduce_on_host(host, flat, op)
        else:
            work = dist.all_reduce(self._device_for(staged), op=_OPS[op], group=self._group, async_op=True)
            self._finish(work, "all_reduce", staged)
        if op is ReduceOp.AVG:
            staged.div_(self.size)
        if staged is not tensor:
            tensor.copy_(staged)
        return x

    def all_gather(self, x: Any) -> Any:
        tensor = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.contiguous()
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        work = dist.all_gather(out, self._device_for(tensor), group=self._group, async_op=True)
        self._finish(work, "all_gather", tensor, factor=self.size)
        return [o.numpy() for o in out] if isinstance(x, np.ndarray) else out

    def broadcast(self, x: Any, src: int = 0) -> Any:
        self._check_peer(src, "src")
        tensor = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
        staged = self._on_device(tensor if tensor.is_contiguous() else tensor.contiguous())
        work = dist.broadcast(self._device_for(staged), group=self._group, group_src=src, async_op=True)
        self._finish(work, "broadcast", staged)
        if staged is not tensor:
            tensor.copy_(staged)
        return x

    def gather(self, x: Any, dst: int = 0) -> Any:
        self._check_peer(dst, "dst")
        tensor = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.contiguous()
        out = [torch.empty_like(tensor) for _ in range(self.size)] if self.rank == dst else None
        work = dist.gather(self._device_for(tensor), gather_list=out, group=self._group, group_dst=dst, async_op=True)
        self._finish(work, "gather", tensor, factor=self.size)
        if out is None:
            return None
        return [o.numpy() for o in out] if isinstance(x, np.ndarray) else out

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        dist.all_gather(sizes, torch.tensor([payload.numel()], dtype=torch.int64), group=self._p2p)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(max(longest, 1), dtype=torch.uint8)
        padded[: payload.numel()] = payload
        out = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(out, padded, group=self._p2p)
        return [o[: int(s)].numpy().tobytes() for o, s in zip(out, sizes, strict=False)]
