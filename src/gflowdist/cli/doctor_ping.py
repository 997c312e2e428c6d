"""The two 2-rank pings of ``gflowdist doctor``: a real round trip on MPI and on gloo.

A ping sends :data:`PING_BYTES` bytes from rank 0 to rank 1, which sends them
back; one warm-up exchange, then :data:`PING_ROUNDS` timed ones, through
:class:`~gflowdist.comm.mpi.MPIComm` or :class:`~gflowdist.comm.torch_dist.TorchComm`
(:func:`ping_child`). Rank 0 prints its result on one line that starts with
:data:`PING_MARK`; :func:`ping_verdict` reads it into a
:class:`~gflowdist.cli.doctor_check.Check`.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

from gflowdist.cli.doctor_check import FAILED, OK, Check, Launched, Result, child_env, last_line
from gflowdist.engines import MPI, TORCH
from gflowdist.jobenv import MPIEXEC_VARIABLE, free_port

if TYPE_CHECKING:
    from gflowdist.comm.base import Communicator

__all__ = [
    "PING_ROUNDS",
    "PING_BYTES",
    "PING_MARK",
    "start_mpi_ping",
    "mpi_ping_verdict",
    "start_gloo_ping",
    "gloo_ping_verdict",
    "ping_verdict",
    "ping_child",
]

#: Timed exchanges per ping (after one warm-up).
PING_ROUNDS = 20
#: Bytes per ping message.
PING_BYTES = 1024
#: User tag of the ping messages.
PING_TAG = 7
#: Prefix of the line in which rank 0 of a ping reports its result (JSON follows).
PING_MARK = "GFLOWDIST_PING "
_GLOO_FIX = (
    "if the host name does not resolve to a local address, export GLOO_SOCKET_IFNAME=lo; loopback TCP must be allowed"
)


def _ping_command(engine: str) -> list[str]:
    return [sys.executable, "-c", f"from gflowdist.cli.doctor_ping import ping_child; ping_child({engine!r})"]


def start_mpi_ping(mpiexec: str, mpiexec_args: tuple[str, ...], timeout: float) -> Launched:
    argv = [mpiexec, "-n", "2", *mpiexec_args, *_ping_command(MPI.name)]
    return Launched([(argv, child_env())], timeout)


def mpi_ping_verdict(results: list[Result], timeout: float) -> Check:
    code, output, timed_out = results[0]
    mismatch = (
        "this mpiexec does not match mpi4py's MPI library (compare the 'MPI library' and "
        "'mpiexec' lines): use that library's mpiexec; `pip install mpich` gives a matching "
        f"pair, or set {MPIEXEC_VARIABLE} / launch.mpiexec"
    )
    reproduce = (
        f'reproduce with `mpiexec -n 2 {sys.executable} -c "from mpi4py import MPI; '
        f'print(MPI.COMM_WORLD.Get_size())"` (must print 2 twice); the usual cause: ' + mismatch
    )
    if timed_out:
        return Check(
            "mpi ping", FAILED, f"2 ranks did not finish within {timeout:g} s (processes killed)", fix=reproduce
        )
    return ping_verdict("mpi ping", code, output, failed_fix=reproduce, wrong_world_fix=mismatch)


def start_gloo_ping(timeout: float) -> Launched:
    env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2")
    return Launched(
        [(_ping_command(TORCH.name), dict(env, RANK=str(rank), LOCAL_RANK=str(rank))) for rank in range(2)], timeout
    )


def gloo_ping_verdict(results: list[Result], timeout: float) -> Check:
    if any(timed_out for _, _, timed_out in results):
        return Check(
            "gloo ping", FAILED, f"2 ranks did not finish within {timeout:g} s (processes killed)", fix=_GLOO_FIX
        )
    failed = next(((code, output) for code, output, _ in results if code != 0), None)
    if failed is not None:
        return ping_verdict("gloo ping", failed[0], failed[1], failed_fix=_GLOO_FIX)
    return ping_verdict("gloo ping", 0, results[0][1], failed_fix=_GLOO_FIX)


def ping_verdict(name: str, code: int, output: str, *, failed_fix: str, wrong_world_fix: str | None = None) -> Check:
    """Read rank 0's :data:`PING_MARK` line (see :func:`ping_child`) from a ping's output."""
    marked = [line[len(PING_MARK) :] for line in output.splitlines() if line.startswith(PING_MARK)]
    if not marked:
        return Check(name, FAILED, f"exit status {code}: {last_line(output)}", fix=failed_fix)
    try:
        result = json.loads(marked[0])
    except json.JSONDecodeError:
        return Check(name, FAILED, f"unreadable result line: {marked[0][:200]}", fix=failed_fix)
    if result.get("size") != 2:
        return Check(name, FAILED, str(result.get("error")), fix=wrong_world_fix or failed_fix)
    if result.get("error") or code != 0:
        return Check(
            name, FAILED, str(result.get("error") or f"exit status {code}: {last_line(output)}"), fix=failed_fix
        )
    median_ms, min_ms = 1e3 * result["rtt_median_s"], 1e3 * result["rtt_min_s"]
    return Check(
        name,
        OK,
        f"2 ranks, round trip {median_ms:.3f} ms (median of {result['rounds']} "
        f"x {result['bytes']} B; min {min_ms:.3f} ms)",
    )


def ping_child(engine: str, *, rounds: int = PING_ROUNDS, nbytes: int = PING_BYTES, timeout: float = 10.0) -> None:
    """The program each ping rank runs (``engine``: ``"mpi"`` or ``"torch"``).

    Rank 0 sends ``nbytes`` bytes to rank 1 and waits for them to come back,
    ``rounds + 1`` times (the first is a warm-up), checks the echo is the
    same bytes, and prints ``PING_MARK + json`` with ``rtt_median_s``,
    ``rtt_min_s``, ``rounds``, ``bytes`` and ``size`` (the world size it saw).
    A world of other than 2 ranks prints an ``error`` instead. Every
    receive has a ``timeout`` (a :class:`~gflowdist.errors.DeadlineError` ends
    the process with a traceback and a non-zero status).
    """
    if engine == MPI.name:
        from mpi4py import MPI as mpi4py

        from gflowdist.comm.mpi import MPIComm

        comm: Communicator = MPIComm(mpi4py.COMM_WORLD)
    else:
        from datetime import timedelta

        from gflowdist.comm.rendezvous import init_default_group
        from gflowdist.comm.torch_dist import TorchComm

        init_default_group("gloo", timeout=timedelta(seconds=timeout))
        comm = TorchComm()
    try:
        if comm.size != 2:
            print(
                PING_MARK
                + json.dumps(
                    {
                        "size": comm.size,
                        "error": f"the ranks saw a world of {comm.size}, not 2: the launcher and the "
                        f"library do not belong together",
                    }
                ),
                flush=True,
            )
            return
        payload = bytes(i % 251 for i in range(nbytes))
        rtts = []
        for i in range(rounds + 1):
            if comm.rank == 0:
                start = time.perf_counter()
                comm.send(payload, 1, PING_TAG, timeout=timeout)
                _, echo = comm.recv(1, PING_TAG, timeout=timeout)
                elapsed = time.perf_counter() - start
                if bytes(echo.numpy()) != payload:
                    print(
                        PING_MARK + json.dumps({"size": 2, "error": "the echo differs from the message sent"}),
                        flush=True,
                    )
                    return
                if i:
                    rtts.append(elapsed)
            else:
                _, got = comm.recv(0, PING_TAG, timeout=timeout)
                comm.send(got, 0, PING_TAG, timeout=timeout)
        comm.barrier(timeout=timeout)
        if comm.rank == 0:
            rtts.sort()
            print(
                PING_MARK
                + json.dumps(
                    {
                        "size": 2,
                        "rounds": rounds,
                        "bytes": nbytes,
                        "rtt_median_s": rtts[rounds // 2],
                        "rtt_min_s": rtts[0],
                    }
                ),
                flush=True,
            )
    finally:
        comm.free()
        if engine != MPI.name:
            import torch.distributed as dist

            dist.destroy_process_group()
