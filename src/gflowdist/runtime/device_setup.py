"""Putting this rank on its device before any CUDA work: ``launch.devices`` applied.

:func:`setup_device` is the first thing :func:`gflowdist.runtime.job.run_job`
does, before the world communicator exists (the torch engine then picks
nccl only when this rank's device is a GPU): it asks torch how many CUDA
devices this process sees (``CUDA_VISIBLE_DEVICES`` applied), applies the
rule of :func:`gflowdist.devices.choose_device` to this rank's local rank, and
on a GPU calls ``torch.cuda.set_device`` so that every later
``torch.device("cuda")`` and collective lands on it. Roles get the result as
``self.device``. Tensors never cross MPI from a GPU directly: the codec and
the MPI collectives stage them through host memory
(:mod:`gflowdist.transport.frames`, :mod:`gflowdist.comm.staging`), and
replayed batches, received into host memory, move to the device of the fresh
ones before ``loss()``.
"""

from __future__ import annotations

import os

import torch

from gflowdist.devices import DeviceChoice, choose_device, launcher_rank, local_rank

__all__ = ["setup_device"]


def setup_device(setting: str | tuple[str, ...]) -> DeviceChoice:
    """Choose this rank's device under ``launch.devices`` = ``setting`` and make it current."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    local, where = local_rank(os.environ, launcher_rank(os.environ))
    choice = choose_device(setting, local, gpus, where=where)
    if choice.cuda_index is not None:
        torch.cuda.set_device(choice.cuda_index)
    return choice
