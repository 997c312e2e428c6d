"""Which device each rank computes on: pure decisions, so they are tested without a GPU.

The rule (``launch.devices``, default ``auto``):

* ``auto``: with ``G`` CUDA devices visible to the rank, ``cuda:<local rank mod G>``;
  with none, ``cpu``. Ranks on one host therefore take one GPU each, and
  more ranks than GPUs share them round-robin (local ranks 0 and G share
  ``cuda:0``). Where a launcher already gave each rank one GPU
  (``CUDA_VISIBLE_DEVICES`` set per rank, as ``srun --gpus-per-task=1``
  does), ``G`` is 1 and every rank uses its ``cuda:0``.
* ``cpu``: every rank on the CPU, GPUs or not.
* ``cuda``: as ``auto``, but a rank that sees no CUDA device is an error.
* a list, e.g. ``[cuda:0, cuda:1, cpu]``: local rank ``i`` uses entry
  ``i mod len(list)``; ``cuda`` in a list means "by local rank", as ``auto``.

The *local rank* (a rank's index among the ranks of its host) comes from
the launcher's environment, first found of :data:`LOCAL_RANK_VARIABLES`:
torchrun's (and ``gflowdist run --engine torch``'s) ``LOCAL_RANK``, Open MPI's
``OMPI_COMM_WORLD_LOCAL_RANK``, MPICH hydra's (and Intel MPI's)
``MPI_LOCALRANKID``, MVAPICH2's ``MV2_COMM_WORLD_LOCAL_RANK``, Cray PMI's
``PMI_LOCAL_RANK``, then Slurm's ``SLURM_LOCALID`` (last: an ``mpiexec``
started inside an allocation inherits the batch step's). With none of them
the global rank stands in (right on one host) and the reason says so.

``G`` is what the rank's torch reports (``torch.cuda.device_count()``), so a
``CUDA_VISIBLE_DEVICES`` mask is already applied: with ``0,1`` set, ``G`` is
2 and ``cuda:1`` is the physical GPU 1; with ``""`` or ``-1``, ``G`` is 0.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gflowdist.engines import ENGINES
from gflowdist.errors import ConfigError

__all__ = [
    "replacement_device",
    "LOCAL_RANK_VARIABLES",
    "RANK_VARIABLES",
    "DeviceChoice",
    "local_rank",
    "launcher_rank",
    "choose_device",
    "needs_cuda",
    "AveragingChoice",
    "HOST_ENGINES",
    "choose_averaging",
]

#: (variable, launcher) in the order they are believed.
LOCAL_RANK_VARIABLES = (
    ("LOCAL_RANK", "torchrun"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI"),
    ("MPI_LOCALRANKID", "MPICH hydra"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "MVAPICH2"),
    ("PMI_LOCAL_RANK", "Cray PMI"),
    ("SLURM_LOCALID", "Slurm"),
)


#: Variables by which launchers announce a rank's global rank (before any communicator exists).
RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


@dataclass(frozen=True)
class DeviceChoice:
    """The device of one rank (``"cpu"`` or ``"cuda:N"``) and, in words, why."""

    device: str
    reason: str

    @property
    def cuda_index(self) -> int | None:
        """N of ``cuda:N``; None on the CPU."""
        return int(self.device.split(":")[1]) if self.device.startswith("cuda:") else None


def local_rank(env: Mapping[str, str], global_rank: int = 0) -> tuple[int, str]:
    """``(local rank, where it came from)`` from launcher variables; else ``global_rank``, saying so."""
    for name, launcher in LOCAL_RANK_VARIABLES:
        value = env.get(name)
        if value is None or value == "":
            continue
        if not value.strip().isdigit():
            raise ConfigError(
                f"the launcher variable {name}={value!r} should be a local rank (an integer >= 0)", key="launch.devices"
            )
        return int(value), f"{name}={int(value)} ({launcher})"
    return global_rank, f"no launcher variable names the local rank; the global rank {global_rank} stands in"


def launcher_rank(env: Mapping[str, str]) -> int:
    """The global rank a launcher announced (first of :data:`RANK_VARIABLES`), 0 for a plain process."""
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return 0


def needs_cuda(setting: str | Sequence[str]) -> bool:
    """Whether ``setting`` can fail where no CUDA device is visible (``auto`` and ``cpu`` never do)."""
    if isinstance(setting, str):
        return setting not in ("auto", "cpu")
    return any(entry != "cpu" for entry in setting)


def choose_device(
    setting: str | Sequence[str], local: int, gpus: int, *, where: str = "", seen_by: str = "this rank"
) -> DeviceChoice:
    """The device for a rank of local rank ``local`` that sees ``gpus`` CUDA devices (see the module doc).

    ``where`` says where the local rank came from (for the reason). A ``cuda``
    the rank cannot have is a :class:`ConfigError` naming ``launch.devices``;
    ``seen_by`` is who saw the ``gpus`` it names (the launcher, judging for its
    ranks before it starts them, says ``"this host"``).
    """
    origin = f" (local rank {local}{': ' + where if where else ''})"
    if isinstance(setting, str):
        if setting == "cpu":
            return DeviceChoice("cpu", "launch.devices is cpu")
        if setting == "auto" and gpus == 0:
            return DeviceChoice("cpu", "launch.devices is auto and no CUDA device is visible")
        return _by_local_rank(setting, local, gpus, origin, seen_by)
    if not setting:
        raise ConfigError("is an empty list: give at least one device", key="launch.devices")
    entry = setting[local % len(setting)]
    picked = f"entry {local % len(setting)} of launch.devices{origin}"
    if entry == "cpu":
        return DeviceChoice("cpu", picked)
    if entry == "cuda":
        return _by_local_rank(entry, local, gpus, origin, seen_by)
    index = int(entry.split(":")[1])
    if index >= gpus:
        raise ConfigError(f"{picked} is {entry}, but {seen_by} sees {_gpus(gpus)}", key="launch.devices")
    return DeviceChoice(entry, picked)


def replacement_device(setting: str | Sequence[str], rank: int, lost: str | None, gpus: int) -> DeviceChoice:
    """The device of the process that replaces lost rank ``rank`` (``faults.on_actor_loss: replace``), which sees
    ``gpus`` CUDA devices: the device ``lost`` that rank had (the rule above applied to it at start-up), or, when
    that is not known, the rule applied with the global rank standing in for the local one. A ``cuda:N`` it cannot
    have is a :class:`ConfigError` naming ``launch.devices``."""
    if lost is None:
        return choose_device(setting, rank, gpus, where="the global rank of the lost rank it replaces")
    if lost == "cpu":
        return DeviceChoice("cpu", f"as rank {rank}, which it replaces")
    index = int(lost.split(":")[1])
    if index >= gpus:
        raise ConfigError(
            f"gave rank {rank} {lost}, but the process that replaces it sees {_gpus(gpus)}", key="launch.devices"
        )
    return DeviceChoice(lost, f"as rank {rank}, which it replaces")


def _by_local_rank(setting: str, local: int, gpus: int, origin: str, seen_by: str) -> DeviceChoice:
    if gpus == 0:
        raise ConfigError(f"asks for {setting}, but {seen_by} sees no CUDA device{origin}", key="launch.devices")
    index = local % gpus
    shared = f"; shared with local rank {index}" if local >= gpus else ""
    return DeviceChoice(f"cuda:{index}", f"local rank mod {_gpus(gpus)}{origin}{shared}")


def _gpus(count: int) -> str:
    return f"{count} visible CUDA device{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class AveragingChoice:
    """How one agent group averages (gradients or models), chosen at start-up by :func:`choose_averaging`.

    ``path``: ``"nccl"`` (on the GPUs), ``"host"`` (through host memory on the job's engine) or
    ``"none"`` (a group of one); ``engine``: what carries it (``nccl``, ``mpi``, ``gloo``, ``local``).
    """

    path: str
    engine: str
    reason: str

    def describe(self) -> str:
        """``"host memory on mpi: ranks 0 and 1 share cuda:0 on node-a"``."""
        where = {"nccl": "nccl on the GPUs", "host": f"host memory on {self.engine}", "none": "nothing to average"}
        return f"{where[self.path]}: {self.reason}"


#: The engine that carries host averaging, by ``launch.engine`` as resolved (each engine's descriptor says).
HOST_ENGINES = {name: engine.host_averaging for name, engine in ENGINES.items()}


def choose_averaging(engine: str, members: Sequence[tuple[int, str, str]]) -> AveragingChoice:
    """How an agent group whose trainers are ``members`` (``(world rank, host, device)``) averages.

    nccl needs the torch engine and every member on a GPU of its own (nccl refuses two
    ranks on one device); otherwise the average goes through host memory on the job's
    engine (MPI, or gloo for the torch engine), which takes CUDA tensors and stages them.
    """
    host_engine = HOST_ENGINES.get(engine, engine)
    if len(members) < 2:
        return AveragingChoice("none", "", "a group of one trainer")
    on_cpu = [rank for rank, _, device in members if not device.startswith("cuda")]
    if len(on_cpu) == len(members):
        return AveragingChoice("host", host_engine, "every trainer of the group computes on the CPU")
    if on_cpu:
        return AveragingChoice(
            "host", host_engine, f"{_ranks(on_cpu)} on the CPU: nccl needs every trainer of the group on a GPU"
        )
    seen: dict[tuple[str, str], int] = {}
    for rank, host, device in members:
        other = seen.setdefault((host, device), rank)
        if other != rank:
            return AveragingChoice(
                "host",
                host_engine,
                f"ranks {other} and {rank} share {device} on {host or 'one host'} (nccl refuses two ranks on one GPU)",
            )
    if not (engine in ENGINES and ENGINES[engine].averages_on_nccl):
        return AveragingChoice(
            "host",
            host_engine,
            f"every trainer has a GPU of its own, but the {engine} engine reduces through host memory "
            f"(launch.engine: torch averages on nccl)",
        )
    return AveragingChoice("nccl", "nccl", "every trainer of the group has a GPU of its own")


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
