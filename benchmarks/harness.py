"""What the self-launching benchmarks share: start 2 MPI ranks or 2 gloo processes, read the result.

A benchmark script re-runs itself as workers (``--worker mpi|torch`` plus its
own arguments); rank 0 prints one line ``RESULT <json>``, which
:func:`parse_result` reads back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from gflowdist.jobenv import find_mpiexec, free_port, without_launcher

__all__ = ["clean_env", "parse_result", "run_mpi_workers", "run_torch_workers", "fmt_size"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any outer job's identity, one thread per rank."""
    env = without_launcher(dict(os.environ))
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)
    return env


def parse_result(output: str):
    for line in output.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"worker printed no result:\n{output}")


def run_mpi_workers(script: str, args: list[str], nprocs: int = 2, timeout: float = 600):
    """``mpiexec -n nprocs python script --worker mpi args...``; rank 0's RESULT."""
    cmd = [find_mpiexec(), "-n", str(nprocs), sys.executable, script, "--worker", "mpi", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    return parse_result(out.stdout + out.stderr)


def run_torch_workers(script: str, args: list[str], nprocs: int = 2, timeout: float = 600):
    """``nprocs`` gloo workers on a free loopback port; rank 0's RESULT."""
    env = clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nprocs))
    procs = [
        subprocess.Popen(
            [sys.executable, script, "--worker", "torch", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env, RANK=str(r)),
            start_new_session=True,
        )
        for r in range(nprocs)
    ]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return parse_result(outs[0])


def fmt_size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"
