"""torchgfn's own tutorial scripts, side by side: the original library vs gflowdist by changing one import.

    python benchmarks/torchgfn_scripts.py --torchgfn /path/to/torchgfn --python /path/to/venv/bin/python

``--torchgfn`` is a checkout of torchgfn (tag v2.4.1; its ``tutorials/``
directory is all that is read) and ``--python`` an interpreter that has
torchgfn 2.4.1, mpi4py and gflowdist installed (torchgfn pins numpy<2, so
usually a venv of its own). The script copies ``tutorials/`` twice into a
temporary directory, leaves one copy as it is and in the other replaces
``gfn.utils.distributed`` by ``gflowdist.compat.torchgfn`` in the three
scripts (nothing else), then runs each configuration with both copies under
the ``mpiexec`` next to ``--python`` with the same arguments and seed, and
prints the exit status, the wall time and rank 0's final metrics (loss, L1
distance to the target distribution, modes found). Nothing of torchgfn is
written anywhere else.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gflowdist.jobenv import free_port, without_launcher
from gflowdist.process_tree import kill_group

__all__ = ["CONFIGS", "prepare", "run_one", "metrics"]

SCRIPTS = ("train_hypergrid.py", "train_hypergrid_ddp.py", "train_hypergrid_mog.py")
#: the arguments every run shares: torchgfn's 2-D HyperGrid of height 8; 48 trajectories per
#: iteration (divisible by 3 and 4 trainers), 300 iterations, validation every 100 on 10,000 samples
COMMON = [
    "--ndim",
    "2",
    "--height",
    "8",
    "--batch_size",
    "48",
    "--n_trajectories",
    "14400",
    "--validate_environment",
    "--validation_samples",
    "10000",
    "--validation_interval",
    "100",
]
#: (name, ranks, script, its own arguments)
CONFIGS = [
    (
        "hypergrid, 3 trainers + 1 buffer",
        4,
        "train_hypergrid.py",
        ["--distributed", "--dist_backend", "gloo", "--num_remote_buffers", "1"],
    ),
    (
        "hypergrid, 2 agent groups of 2 + 1 buffer",
        5,
        "train_hypergrid.py",
        ["--distributed", "--dist_backend", "gloo", "--num_remote_buffers", "1", "--num_agent_groups", "2"],
    ),
    (
        "hypergrid_ddp, 3 trainers + 1 buffer",
        4,
        "train_hypergrid_ddp.py",
        ["--num_remote_buffers", "1", "--wandb_project", ""],
    ),
    (
        "hypergrid_mog, 3 trainers + 1 buffer",
        4,
        "train_hypergrid_mog.py",
        ["--num_remote_buffers", "1", "--wandb_project", ""],
    ),
]


def prepare(torchgfn: Path, workdir: Path) -> dict[str, Path]:
    """``{"torchgfn": dir, "gflowdist": dir}``: two copies of the tutorials, the second with the import changed."""
    roots = {}
    for lib in ("torchgfn", "gflowdist"):
        root = workdir / lib
        shutil.copytree(torchgfn / "tutorials", root / "tutorials")
        if lib == "gflowdist":
            for script in SCRIPTS:
                path = root / "tutorials" / "examples" / script
                text = path.read_text()
                if "gfn.utils.distributed" not in text:
                    raise SystemExit(f"{path} does not import gfn.utils.distributed: is this torchgfn 2.4.1?")
                path.write_text(text.replace("gfn.utils.distributed", "gflowdist.compat.torchgfn"))
        roots[lib] = root
    return roots


def run_one(python: str, root: Path, ranks: int, script: str, args: list[str], timeout: float) -> dict:
    """One run: ``{"status", "seconds", "output", "command"}`` (the job's own process group is killed after)."""
    mpiexec = Path(python).parent / "mpiexec"
    command = [str(mpiexec), "-n", str(ranks), python, f"tutorials/examples/{script}", *args, *COMMON]
    env = without_launcher(dict(os.environ))
    env.update(PYTHONPATH=str(root), OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    start = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        output, _ = proc.communicate()
        status = "timeout"
    return {
        "status": status,
        "seconds": time.monotonic() - start,
        "output": output,
        "command": shlex.join(["mpiexec", "-n", str(ranks), "python", *command[4:]]),
    }


_NUMBER = r"(-?\d+(?:\.\d+)?(?:e-?\d+)?|None)"


def metrics(output: str) -> dict[str, float | None]:
    """Rank 0's final ``loss``, ``l1_dist`` and ``n_modes_found`` from the script's last log line.

    The line is read from ``Training complete, logs:`` on, across line
    breaks: mpiexec may put another rank's log line inside it.
    """
    start = output.rfind("Training complete, logs:")
    line = "" if start < 0 else output[start:]
    found = {}
    for key in ("loss", "l1_dist", "n_modes_found"):
        match = re.search(rf"'{key}': {_NUMBER}", line)
        found[key] = None if match is None or match.group(1) == "None" else float(match.group(1))
    return found


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchgfn", type=Path, required=True, help="a torchgfn checkout (tag v2.4.1)")
    parser.add_argument("--python", required=True, help="interpreter with torchgfn 2.4.1, mpi4py, gflowdist")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--only", help="run only configurations whose name contains this")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run each configuration this many times per library, alternating which goes first",
    )
    parser.add_argument("--keep-logs", type=Path, help="write each run's output here")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at start; common arguments: {' '.join(COMMON)}")
    head = f"{'configuration':<42} | {'library':<9} | {'exit':>4} | {'wall s':>6} | {'loss':>6} | {'L1':>6} | modes"
    rows = [head, "-" * len(head)]
    with tempfile.TemporaryDirectory(prefix="torchgfn-scripts-") as tmp:
        roots = prepare(args.torchgfn, Path(tmp))
        for name, ranks, script, extra in CONFIGS:
            if args.only and args.only not in name:
                continue
            for turn in range(args.rounds):
                order = list(roots.items()) if turn % 2 == 0 else list(reversed(roots.items()))
                for lib, root in order:
                    rows.append(_run_row(args, name, lib, root, ranks, script, extra, turn))
    print("\n" + "\n".join(rows))
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    return 0


def _run_row(args, name: str, lib: str, root: Path, ranks: int, script: str, extra: list[str], turn: int) -> str:
    """Run one configuration with one library; its table row (and its log, with ``--keep-logs``)."""
    run = run_one(args.python, root, ranks, script, extra, args.timeout)
    found = metrics(run["output"])
    print(f"[{lib}] {run['command']}  -> exit {run['status']} in {run['seconds']:.0f} s", flush=True)
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"\W+", "_", name).strip("_")
        (args.keep_logs / f"{slug}.{lib}.{turn}.log").write_text(run["output"])
    return (
        f"{name:<42} | {lib:<9} | {run['status']!s:>4} | {run['seconds']:6.0f} | "
        f"{_cell(found['loss'], '.4f'):>6} | {_cell(found['l1_dist'], '.4f'):>6} | "
        f"{_cell(found['n_modes_found'], '.0f')}"
    )


if __name__ == "__main__":
    sys.exit(main())
