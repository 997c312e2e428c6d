"""The doctor's ``devices`` line: the devices this process sees and the one ``gflowdist run`` would give it.

Every rank of a job makes the same decision with its own environment
(:func:`gflowdist.devices.choose_device`); the doctor shows it for its own
process, which is local rank 0 unless it runs inside a job.
"""

from __future__ import annotations

import os

from gflowdist.devices import choose_device, local_rank
from gflowdist.errors import ConfigError

__all__ = ["describe_devices"]


def describe_devices(setting: str | tuple[str, ...] = "auto") -> tuple[bool, str, str | None]:
    """``(ok, detail, fix)``: the devices torch sees and this process's choice under ``launch.devices``."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [f"cuda:{index} {torch.cuda.get_device_name(index)}" for index in range(gpus)]
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = "cpu" + (", " + ", ".join(names) if names else " only (no CUDA device visible)")
    if mask is not None:
        seen += f" (CUDA_VISIBLE_DEVICES={mask!r})"
    local, where = local_rank(os.environ)
    shown = setting if isinstance(setting, str) else "[" + ", ".join(setting) + "]"
    try:
        choice = choose_device(setting, local, gpus, where=where)
    except ConfigError as err:
        return (
            False,
            f"{seen}; launch.devices {shown}: {err.detail}",
            "set launch.devices to auto or cpu, or run where a GPU is visible",
        )
    return True, f"{seen}; launch.devices {shown} gives this process {choice.device} ({choice.reason})", None
