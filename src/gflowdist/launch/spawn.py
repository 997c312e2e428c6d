"""``launch``: run a function as one process per device on each machine (VirTex's contract).

    def main(config): ...
    launch(main, num_machines=1, num_gpus_per_machine=4, dist_url="auto", args=(config,))

On each machine, ``num_gpus_per_machine`` workers start; worker ``l`` of
machine ``m`` has global rank ``m * num_gpus_per_machine + l`` in a world of
``num_machines * num_gpus_per_machine``. Each initialises torch.distributed
(``nccl`` when CUDA is available, then uses GPU ``l``; ``gloo`` otherwise — the
original refuses to run without CUDA), passes a barrier, runs
``job_fn(*args)``, passes a barrier and tears its process group down.

- **World of one**: ``job_fn(*args)`` runs in the calling process.
- **Already inside a job** (mpiexec, torchrun, a process group; see
  :mod:`gflowdist.launch.jobs`): nothing is spawned; this process runs
  ``job_fn(*args)`` as its rank of that job, whose size must equal
  ``num_machines * num_gpus_per_machine`` (else :class:`ConfigError`).
- **A failing worker**: the others are stopped and ``launch`` raises
  :class:`PeerLostError` naming the worker's global rank, with its
  traceback as the reason; of several found failed together (a worker
  in a collective with the failing one fails on the closed connection),
  the one whose report was made first.

``dist_url`` is torch's ``init_method``. VirTex's default
``"tcp://127.0.0.1:23456"`` is kept so calls keep their meaning, but a fixed
port collides with any other job on the machine: pass ``"auto"`` (or a
``tcp://host:0`` URL) on a single machine to get a free port. Several
machines need a real ``tcp://<machine 0 address>:<port>`` that every
machine passes identically, with its own ``machine_rank``.
For a ``tcp://`` URL, worker 0 of machine 0 serves the rendezvous store on
the URL's address only, not on every address of its machine
(:func:`gflowdist.comm.rendezvous.init_default_group`): that address must be
one of machine 0's, reachable from the other machines.

Workers are started with multiprocessing's ``spawn`` method, as VirTex's
``torch.multiprocessing.spawn`` does: a forked child hangs in its first
parallel torch operation once the parent has used OpenMP threads, and CUDA
does not survive a fork either. So ``job_fn`` must be importable (a
module-level function), ``job_fn`` and ``args`` are handed to the children
by multiprocessing's own pickling (this machine only, parent to its own
children; nothing else in gflowdist pickles), and the script needs the usual
``if __name__ == "__main__":`` guard. A worker's traceback reaches the
parent as UTF-8 text through a pipe.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from gflowdist.engines import TORCH
from gflowdist.errors import ConfigError, PeerLostError
from gflowdist.jobenv import free_port
from gflowdist.launch.jobs import existing_job

__all__ = ["launch", "resolve_dist_url", "free_port", "DEFAULT_DIST_URL"]

DEFAULT_DIST_URL = "tcp://127.0.0.1:23456"

#: seconds a stopped worker gets to exit after SIGTERM before SIGKILL
_GRACE_S = 5.0


def resolve_dist_url(dist_url: str, num_machines: int = 1) -> str:
    """``dist_url`` with ``"auto"`` or port 0 replaced by a free port (single machine only)."""
    if dist_url == "auto":
        dist_url = "tcp://127.0.0.1:0"
    parts = urlsplit(dist_url)
    if parts.scheme != "tcp" or parts.port != 0:
        return dist_url
    if num_machines > 1:
        raise ConfigError(
            f"{dist_url!r}: a free port can only be picked on one machine; with "
            f"{num_machines} machines pass tcp://<address of machine 0>:<port>",
            key="dist_url",
        )
    host = parts.hostname or "127.0.0.1"
    return f"tcp://{host}:{free_port(host)}"


def _check_counts(num_machines: int, num_gpus_per_machine: int, machine_rank: int) -> None:
    for name, value in (("num_machines", num_machines), ("num_gpus_per_machine", num_gpus_per_machine)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"must be an int >= 1, got {value!r}", key=name)
    if not isinstance(machine_rank, int) or not 0 <= machine_rank < num_machines:
        raise ConfigError(f"must be in [0, {num_machines}), got {machine_rank!r}", key="machine_rank")


def _run_in_existing_job(job_fn: Callable[..., Any], world: int, args: Sequence[Any]) -> None:
    import torch

    from gflowdist.comm.select import world_comm
    from gflowdist.launch.torchrun import ensure_process_group

    ensure_process_group("cuda" if torch.cuda.is_available() else "cpu")
    size = world_comm().size
    if size != world:
        raise ConfigError(
            f"launch() asked for {world} processes, but it runs inside a job of {size} ranks; "
            "make num_machines * num_gpus_per_machine match the job",
            key="num_gpus_per_machine",
        )
    job_fn(*args)


def _worker(
    local_rank: int,
    job_fn: Callable[..., Any],
    world: int,
    per_machine: int,
    machine_rank: int,
    dist_url: str,
    backend: str,
    args: Sequence[Any],
    report: multiprocessing.connection.Connection,
) -> None:
    """Body of one worker process: rendezvous, run, tear down; a traceback goes to the parent."""
    rank = machine_rank * per_machine + local_rank
    try:
        import torch
        import torch.distributed as dist

        from gflowdist.comm.rendezvous import init_default_group
        from gflowdist.comm.select import release_world_comm, reset_world_comm, world_comm

        os.environ.update(
            RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(per_machine)
        )
        init_default_group(backend, init_method=dist_url, world_size=world, rank=rank)
        reset_world_comm()  # whatever world this process saw before belongs to no job
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        world_comm(TORCH.name).barrier()
        job_fn(*args)
        world_comm(TORCH.name).barrier()
        release_world_comm()
        dist.destroy_process_group()
    except BaseException:
        # when it failed (a clock every process of this machine shares), then the traceback: the parent
        # names the worker that failed first, not a peer that failed because of it (_first_failure)
        report.send_bytes(f"{time.monotonic()!r}\n{traceback.format_exc()}".encode("utf-8", "replace"))
        report.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    report.close()


def _stop(processes: list) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()


def _supervise(processes: list, readers: list, first_rank: int) -> None:
    """Wait for every worker; on the first failure stop the rest and raise with its traceback."""
    messages: dict[int, bytes] = {}
    running = set(range(len(processes)))
    open_readers = dict(enumerate(readers))
    try:
        while running:
            waitables = [processes[i].sentinel for i in running] + list(open_readers.values())
            multiprocessing.connection.wait(waitables)
            for index, reader in list(open_readers.items()):  # drain reports first: a big one blocks its writer
                if reader.poll():
                    try:
                        messages[index] = messages.get(index, b"") + reader.recv_bytes()
                    except EOFError:
                        del open_readers[index]
            exited = [index for index in sorted(running) if processes[index].exitcode is not None]
            running.difference_update(exited)
            failed = [index for index in exited if processes[index].exitcode != 0]
            if failed:
                _stop(processes)
                for index in failed:
                    reader = readers[index]
                    if index not in messages and reader.poll(1.0):
                        try:
                            messages[index] = reader.recv_bytes()
                        except EOFError:
                            pass
                index, text = _first_failure({i: messages.get(i, b"") for i in failed})
                code = processes[index].exitcode
                how = f"exited with status {code}" if code > 0 else f"was killed by signal {-code}"
                raise PeerLostError(
                    first_rank + index,
                    role="launch worker",
                    host=socket.gethostname(),
                    reason=f"{how}" + (f":\n{text}" if text else " (no traceback)"),
                )
    finally:
        _stop(processes)
        for reader in readers:
            reader.close()


def _first_failure(reports: dict[int, bytes]) -> tuple[int, str]:
    """Of the failed workers found together, the one that failed first, and its traceback.

    Workers found failed at once are often one failure and its echo: worker 1 raises, and worker 0,
    in a collective with it, fails on the closed connection. Each report starts with the time it was
    made; a worker without one (killed by a signal) counts as last, and ties go to the lower index."""

    def parsed(report: bytes) -> tuple[float, str]:
        text = report.decode("utf-8", "replace")
        stamp, _, rest = text.partition("\n")
        try:
            return float(stamp), rest.rstrip()
        except ValueError:
            return float("inf"), text.rstrip()

    read = {index: parsed(report) for index, report in reports.items()}
    first = min(read, key=lambda index: (read[index][0], index))
    return first, read[first][1]


def launch(
    job_fn: Callable[..., Any],
    num_machines: int = 1,
    num_gpus_per_machine: int = 1,
    machine_rank: int = 0,
    dist_url: str = DEFAULT_DIST_URL,
    args: Sequence[Any] = (),
) -> None:
    """Run ``job_fn(*args)`` on each process of a ``num_machines x num_gpus_per_machine`` world (module docstring)."""
    _check_counts(num_machines, num_gpus_per_machine, machine_rank)
    world = num_machines * num_gpus_per_machine
    if existing_job() is not None:
        _run_in_existing_job(job_fn, world, args)
        return
    if world == 1:
        job_fn(*args)
        return
    import torch

    cuda = torch.cuda.is_available()
    if cuda and torch.cuda.device_count() < num_gpus_per_machine:
        raise ConfigError(
            f"{num_gpus_per_machine} processes per machine but only {torch.cuda.device_count()} CUDA devices here",
            key="num_gpus_per_machine",
        )
    backend = "nccl" if cuda else "gloo"
    url = resolve_dist_url(dist_url, num_machines)
    context = multiprocessing.get_context("spawn")
    processes, readers = [], []
    try:
        for local_rank in range(num_gpus_per_machine):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker,
                name=f"gflowdist-launch-{machine_rank * num_gpus_per_machine + local_rank}",
                args=(local_rank, job_fn, world, num_gpus_per_machine, machine_rank, url, backend, tuple(args), writer),
            )
            process.start()
            writer.close()
            processes.append(process)
            readers.append(reader)
    except BaseException:
        _stop(processes)
        raise
    _supervise(processes, readers, machine_rank * num_gpus_per_machine)
