"""Startup of ``gflowdist run`` (4 ranks) vs ``mpiexec -n 2 python -c "import torch"``, and where it goes.

    python benchmarks/startup.py            # 2 runs of everything, ~1-2 minutes
    python benchmarks/startup.py --quick    # 1 run, 5 steps, only the mpiexec -n 2 baseline: a smoke run

All in one run, medians over ``--repeats``:

- **baselines**: wall time of ``python -c "import torch"`` and of
  ``mpiexec -n 2`` / ``-n 4 python -c "import torch"``;
- **gflowdist run** of ``examples/hypergrid/config.yaml`` (4 ranks: 2
  trainers, 1 buffer, 1 coordinator; 20 steps, quick 5; every rank started cold,
  ``launch.warm_start=false``, for the loop timing of ``loop_timing.py``: the
  default warm start is in ``all.py --only startup``), seconds from starting the
  command to: every rank logging (its first log line: imports, MPI, context
  and the first barrier are done), training starting (the mtime of the run's
  ``config.yaml``, written by the collector right after the startup barrier),
  the first step done (that + the first metrics line's ``time``), the process
  exiting;
- **breakdown**: the same steps timed one by one, with ``time.time()`` stamps
  (one clock for every process of this host):

  - launcher (``--launcher-probe``, one process, what ``gflowdist run`` does
    before it starts ``mpiexec``): Python start, importing the CLI, loading
    the config, the in-a-job check (``gflowdist.jobenv``), finding
    ``mpiexec`` and asking it ``--version``; it says so if any of that
    imported torch;
  - ranks (``mpiexec -n 4 ... --rank-probe``): the steps of
    ``gflowdist.runtime.job.run_job`` in its order, calling the same
    functions: Python start, ``import torch``, the rest of gflowdist, MPI
    init (``world_comm``), ``DistributedContext.create``, run directory +
    ``Wiring.build`` + barrier, ``import torch._dynamo`` (trainers only: the
    Adam constructor imports it), the role's ``setup()``, the startup barrier.
    Median and maximum over the 4 ranks; a barrier row is time spent waiting
    for the slowest rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0_VARIABLE = "GFLOWDIST_BENCH_T0"  # wall-clock launch time handed to the probes


def stamp(marks: list, name: str) -> None:
    marks.append((name, time.time(), time.process_time()))


def durations(t0: float, marks: list) -> dict[str, list[float]]:
    """``[(name, wall, cpu)]`` -> ``{name: [wall s, CPU s]}`` since the previous mark (the first: since ``t0``
    and since this process started)."""
    out, wall, cpu = {}, t0, 0.0
    for name, when, used in marks:
        out[name] = [when - wall, used - cpu]
        wall, cpu = when, used
    return out


def launcher_probe() -> None:
    """What ``gflowdist run`` does before starting mpiexec, step by step (this process only)."""
    marks: list = []
    t0 = float(os.environ[T0_VARIABLE])
    stamp(marks, "python start")
    from gflowdist.cli import run_cmd

    stamp(marks, "import the CLI")
    from gflowdist.cli import build_parser

    args = build_parser().parse_args(["run", str(config_path()), "-n", "4"])  # the CLI's own options
    config, _, _ = run_cmd._load(args)
    stamp(marks, "load the config")
    from gflowdist import jobenv  # what run_cmd.run asks first

    jobenv.in_mpi_job() or jobenv.in_torch_job()
    stamp(marks, "in-a-job check (gflowdist.jobenv)")
    from gflowdist.cli import preflight

    layout = preflight.check_layout_fits(config, 4, source="-n 4")
    preflight.check_extras(config)
    preflight.check_roles_named(config, layout)
    resolved = preflight.resolve_roles(config)
    stamp(marks, "layout fits + role references (no import)")
    preflight.check_launcher(config, jobenv.find_mpiexec)
    stamp(marks, "find mpiexec + --version")
    with tempfile.TemporaryDirectory() as cache:  # a cold role-check cache, then a warm one
        os.environ["XDG_CACHE_HOME"] = cache
        preflight.check_roles_import(config, resolved)
        stamp(marks, "role classes imported and checked (child Python)")
        preflight.check_roles_import(config, resolved)
        stamp(marks, "role check remembered (unchanged files)")
    print("RESULT " + json.dumps({"steps": durations(t0, marks), "imports_torch": "torch" in sys.modules}), flush=True)


def rank_probe() -> None:
    """The steps of run_job on this rank, in order, timed; rank 0 prints every rank's times."""
    marks: list = []
    t0 = float(os.environ[T0_VARIABLE])
    stamp(marks, "mpiexec + python start")
    import torch

    stamp(marks, "import torch")
    import gflowdist.runtime.job as job
    from gflowdist.comm import world_comm
    from gflowdist.config import Config
    from gflowdist.context import DistributedContext
    from gflowdist.layout import Role
    from gflowdist.ops.seeds import rank_seed
    from gflowdist.rundir import agree_run_dir
    from gflowdist.runtime.wiring import StopFlag, Wiring

    stamp(marks, "import gflowdist")
    config = Config.from_yaml(config_path(), [f"run.out_dir={tempfile.gettempdir()}"])
    world = world_comm(config.launch.engine)
    stamp(marks, "MPI init (world_comm)")
    ctx = DistributedContext.create(config.layout, comm=world)
    stamp(marks, "DistributedContext.create")
    run_dir = agree_run_dir(world, config, None)
    w = Wiring.build(ctx, config, StopFlag())
    world.barrier(timeout=60)
    if world.rank == 0:
        run_dir.rmdir()  # a probe leaves no run directory behind
    stamp(marks, "run dir + wiring + barrier")
    if ctx.role is Role.TRAINER:
        import torch._dynamo
    stamp(marks, "import torch._dynamo (trainers)")
    seed = rank_seed(config.run.seed, world.rank)
    job.make_role(ctx, config, torch.Generator().manual_seed(seed))
    stamp(marks, "role setup()")
    world.barrier(timeout=config.faults.startup_timeout_s)
    stamp(marks, "startup barrier")
    mine = {
        "rank": world.rank,
        "role": ctx.role.value,
        "steps": durations(t0, marks),
        "ready": time.time() - t0,
        "cpu": time.process_time(),
    }
    gathered = [json.loads(b) for b in world.all_gather_bytes(json.dumps(mine).encode())]
    del w
    ctx.cleanup()
    if world.rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)


def config_path() -> Path:
    return Path(__file__).resolve().parents[1] / "examples" / "hypergrid" / "config.yaml"


def mpiexec() -> str:
    from gflowdist.jobenv import find_mpiexec

    return find_mpiexec()


def timed(cmd: list[str], **env: str) -> tuple[float, str]:
    from run_reading import child_env

    start = time.time()
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=child_env(**{T0_VARIABLE: repr(start)}, **env)
    )
    seconds = time.time() - start
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return seconds, out.stdout


def measure(repeats: int, quick: bool, out_dir: Path) -> dict:
    from hypergrid import run_gflowdist
    from run_reading import first_step_s, parse_result

    import_torch = [sys.executable, "-c", "import torch"]
    results: dict = {"baseline": {}, "run": [], "launcher": [], "ranks": []}
    steps = 5 if quick else 20
    for _ in range(repeats):
        baselines = {"mpiexec -n 2 python -c 'import torch'": [mpiexec(), "-n", "2", *import_torch]}
        if not quick:
            baselines["python -c 'import torch'"] = import_torch
            baselines["mpiexec -n 4 python -c 'import torch'"] = [mpiexec(), "-n", "4", *import_torch]
        for name, cmd in baselines.items():
            results["baseline"].setdefault(name, []).append(timed(cmd)[0])
        run = run_gflowdist(2, steps, out_dir, [])
        results["run"].append(
            {
                "ranks logging": run["ranks_up_s"],
                "training starts": run["training_start_s"],
                "first step done": first_step_s(run),
                f"exit ({steps} steps)": run["total_s"],
            }
        )
        results["launcher"].append(parse_result(timed([sys.executable, __file__, "--launcher-probe"])[1]))
        results["ranks"].append(
            parse_result(timed([mpiexec(), "-n", "4", sys.executable, __file__, "--rank-probe"])[1])
        )
    return results


def report(results: dict, repeats: int, seconds: float) -> list[str]:
    from gflowdist.timing.text_table import table_lines
    from run_reading import load_average

    med = statistics.median
    lines = [f"startup, median of {repeats} run(s); {load_average()}; {seconds:.0f} s", ""]
    rows = [[name, f"{med(values):.2f}"] for name, values in results["baseline"].items()]
    for what in results["run"][0]:
        rows.append([f"gflowdist run (4 ranks): launch -> {what}", f"{med(r[what] for r in results['run']):.2f}"])
    lines += table_lines(["what", "seconds"], rows)
    lines += [
        "",
        "where it goes: wall seconds (median, max over ranks) and CPU seconds of the process (median); "
        "ranks of every run pooled",
    ]
    rows = [
        [
            f"launcher: {step}",
            f"{med(r['steps'][step][0] for r in results['launcher']):.2f}",
            "",
            f"{med(r['steps'][step][1] for r in results['launcher']):.2f}",
            "",
        ]
        for step in results["launcher"][0]["steps"]
    ]
    ranks = [rank for run in results["ranks"] for rank in run]
    for step in ranks[0]["steps"]:
        wall = [r["steps"][step][0] for r in ranks]
        cpu = [r["steps"][step][1] for r in ranks]
        trainers = [r["steps"][step][1] for r in ranks if r["role"] == "trainer"]
        rows.append(
            [
                f"rank: {step}",
                f"{med(wall):.2f}",
                f"{max(wall):.2f}",
                f"{med(cpu):.2f}",
                f"{med(trainers):.2f}" if trainers else "-",
            ]
        )
    rows.append(
        [
            "rank: mpiexec start -> startup barrier done",
            f"{med(r['ready'] for r in ranks):.2f}",
            f"{max(r['ready'] for r in ranks):.2f}",
            f"{med(r['cpu'] for r in ranks):.2f}",
            f"{med(r['cpu'] for r in ranks if r['role'] == 'trainer'):.2f}",
        ]
    )
    lines += table_lines(["step", "wall", "max wall", "CPU", "trainer CPU"], rows)
    if any(r["imports_torch"] for r in results["launcher"]):
        lines.append("the launcher imported torch before starting mpiexec")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run, 5 steps, only the mpiexec -n 2 baseline")
    parser.add_argument("--repeats", type=int, help="runs of everything (default 2, quick 1)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--out-dir", help="where the run directories go (default: a temporary directory)")
    parser.add_argument("--launcher-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.launcher_probe:
        launcher_probe()
        return 0
    if args.rank_probe:
        rank_probe()
        return 0
    repeats = args.repeats or (1 if args.quick else 2)
    began = time.monotonic()
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-startup-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results = measure(repeats, args.quick, out_dir)
    print("\n".join(report(results, repeats, time.monotonic() - began)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
