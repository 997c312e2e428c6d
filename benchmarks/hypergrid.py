"""HyperGrid under gflowdist's runtime vs the bare single-process loop: throughput, time to L1, waits.

    python benchmarks/hypergrid.py            # 6 setups x 2 runs: ~4 min on 2 idle cores, ~6-10 min loaded
    python benchmarks/hypergrid.py --quick    # bare and 1T, 20 steps, once: a smoke run, seconds
    python benchmarks/hypergrid.py --profile  # also cProfile every rank (pid-N.prof next to the run dirs)

The problem (every setup): HyperGrid D=2, H=8, 16 trajectories per trainer
per step, P_F and P_B MLPs of 2 hidden layers of 64, Adam (lr 1e-3, log Z
1e-1), seed 0, one torch thread per process. Setups:

- ``bare``: ``examples/hypergrid/bare.py``'s ``train(args)`` in one process,
  no framework (no replay, no MPI);
- ``1T no replay``: ``gflowdist run examples/hypergrid/config.yaml -n 3`` with
  ``replay.replay_fraction=0``: 1 trainer, 1 buffer, 1 coordinator; the
  trainer still sends every trajectory to the buffer but learns from its 16
  fresh ones only, the same computation as bare: the framework's overhead;
- ``1T``: the same with the example's replay (below);
- ``2T``: ``-n 4``: 2 trainers averaging gradients, 1 buffer, 1 coordinator;
- ``3T``: ``-n 5``: 3 trainers, 1 buffer, 1 coordinator (torchgfn's layout);
- ``3T rtt``: ``3T`` with ``replay.prefetch=0``, so each step
  requests its replay batch and waits for it: its ``wait_replay`` per step is
  the buffer round trip that the default prefetch of 1 hides.

Except in ``1T no replay``, trainers train on their 16 fresh trajectories plus
``round(16 x 0.25) = 4`` replayed ones (the example config's replay section),
so a step computes the loss of 20 trajectories; bare trains on the 16 fresh
ones.

Definitions (medians over ``--repeats`` runs, runs interleaved so load drift
hits every setup alike):

- **traj/s**: trajectories sampled by all trainers / training wall time. For
  gflowdist the training time is the ``time`` field of the last line of
  ``metrics.jsonl`` (seconds since the collector started, which is right
  after the startup barrier, to the end of the last step); for bare it is
  ``train()``'s own ``seconds``. Startup and shutdown are excluded (the
  ``startup s`` column and ``benchmarks/startup.py`` measure them).
- **window L1** of a trainer at a logged step (every 10 steps): the L1
  distance ``sum_x |p_emp(x) - R(x)/Z|`` over the 64 states, where ``p_emp``
  is the empirical distribution of the last ``W = 2000`` terminal states that
  trainer sampled (``hypergrid_gfn.l1_distance``; in [0, 2]; torchgfn's
  ``l1_dist`` is this divided by 64). **time to L1**: the training time of the
  first logged step at which *every* trainer's window L1 is <= 0.5 (the
  latest trainer's time for that step); ``L1 step`` is that step number.
  With averaged gradients every trainer samples the same policy, so taking
  the worst of the windows only adds their sampling noise (about 0.1 at
  W = 2000, see docs/hypergrid.md), far below 0.5.
- **traj/CPU-s**: trajectories / CPU seconds of every rank's role loop
  (trainers, buffer, coordinator; measured with ``time.process_time`` around
  the loop). Unlike traj/s it hardly depends on other processes' load, so it
  is the number to compare on a shared machine; times the number of free
  cores it bounds traj/s.
- **step ms**: training time / steps (wall time per step of the slowest
  trainer). **CPU ms**: a role's loop CPU time per step (mean over its
  ranks); **CPU %**: loop CPU time / loop wall time (below 100 for a trainer:
  it waited, or other processes had the core). Framework overhead compares
  ``1T no replay`` with bare: ``traj/s(bare) / traj/s(1T no replay) - 1``,
  and the same with CPU per trajectory.
- **wait %**: a trainer's ``wait_replay`` phase (time blocked on its
  buffer's sample reply) / its step time, mean over trainers; **wait ms**:
  ``wait_replay`` per step. In the ``rtt`` row that wait is the whole round
  trip (request sent, served, reply received).
- **startup s**: from starting ``gflowdist run`` to the end of the first
  training step: wall-clock mtime of the run's ``config.yaml`` (written by the
  collector just before it starts) + the first metrics line's ``time``.

Every rank's loop is timed by a ``sitecustomize.py`` that this script writes
to a temporary folder and puts on the ranks' ``PYTHONPATH`` (inside an MPI
rank only; see ``SITECUSTOMIZE``): it wraps the loop functions that
``gflowdist.runtime.job`` calls, and with ``--profile`` also runs cProfile.
Nothing in gflowdist is changed.

The 2-core machine is oversubscribed from 3 ranks on: the coordinator and the
buffer mostly sleep, but 3 trainers plus 2 polling loops on 2 cores, plus
other users' jobs (the load average is printed), share the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gflowdist.timing.text_table import table_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loop_timing import instrumented_env, loop_cpu  # siblings: this folder is on sys.path
from run_reading import (
    child_env,
    first_step_s,
    fmt,
    load_average,
    median,
    parse_result,
    read_run,
    run_directory,
    spread,
    startup_timeline,
    time_to_l1,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hypergrid"
CONFIG = EXAMPLE / "config.yaml"
LOG_EVERY = 10
WINDOW = 2000
BATCH = 16  # trajectories per trainer per step (bare.Args.batch_size, params.trajectories_per_step)
#: setup name -> (trainers, extra overrides); ranks = trainers + buffer + coordinator
SETUPS = {
    "1T no replay": (1, ["replay.replay_fraction=0"]),
    "1T": (1, []),
    "2T": (2, []),
    "3T": (3, []),
    "3T rtt": (3, ["replay.prefetch=0"]),
}
#: references from the issue (torchgfn 2.4.1 multinode HyperGrid, 3 trainers + 1 buffer, this machine size)
TORCHGFN_TRAJ_PER_S = (340, 590)
TORCHGFN_BUFFER_RTT_MS = 19.0


# -- bare ----------------------------------------------------------------------------------------


def bare_worker(steps: int) -> None:
    """Run bare.train in this process; print RESULT with the time of every progress row."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(EXAMPLE))
    import bare

    marks: dict[str, float] = {}
    rows: list[float] = []
    sample = bare.sample_trajectories

    def timed_sample(model, env, n, *args, **kwargs):
        if n != WINDOW and "start" not in marks:  # the first training step (the probe draws WINDOW)
            marks["start"], marks["cpu"] = time.perf_counter(), time.process_time()
        return sample(model, env, n, *args, **kwargs)

    def timed_print(*args, **kwargs) -> None:  # bare prints one line per history row
        rows.append(time.perf_counter())

    bare.sample_trajectories = timed_sample
    bare.print = timed_print
    args = bare.Args(n_steps=steps, batch_size=BATCH, log_every=LOG_EVERY, exact_max_states=0, window=WINDOW)
    m = bare.train(args)
    cpu_ms = 1e3 * (time.process_time() - marks["cpu"]) / steps
    start = marks["start"]
    l1 = [
        {"step": row["step"] - 1, "time": t - start, "l1": [row["l1"]]}
        for row, t in zip(m["history"], rows, strict=False)
    ]
    print(
        "RESULT "
        + json.dumps(
            {
                "traj_per_s": m["traj_per_s"],
                "seconds": m["seconds"],
                "steps": steps,
                "l1": l1,
                "cpu_ms_trainer": cpu_ms,
                "cpu_pct_trainer": 100 * cpu_ms * steps / 1e3 / m["seconds"],
            }
        ),
        flush=True,
    )


def run_bare(steps: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--bare-worker", "--steps", str(steps)],
        capture_output=True,
        text=True,
        timeout=600,
        env=child_env(),
    )
    if out.returncode != 0:
        raise RuntimeError(f"bare worker failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = parse_result(out.stdout)
    result.update(time_to_l1(result["l1"]))
    result["step_ms"] = 1e3 * result["seconds"] / steps
    result["traj_per_cpu_s"] = 1e3 * BATCH / result["cpu_ms_trainer"]
    return result


def run_bare_pair(steps: int) -> float:
    """Two bare loops at once, each its own process: their trajectories/s together (what two cores give
    two independent copies of the work, with no communication: the ceiling for two trainers)."""
    cmd = [sys.executable, __file__, "--bare-worker", "--steps", str(steps)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
        for _ in range(2)
    ]
    try:
        outs = [proc.communicate(timeout=600) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_stdout, stderr) in zip(procs, outs, strict=False):
        if proc.returncode != 0:
            raise RuntimeError(f"bare worker failed ({proc.returncode}):\n{stderr[-3000:]}")
    return sum(parse_result(stdout)["traj_per_s"] for stdout, _ in outs)


# -- gflowdist -----------------------------------------------------------------------------------


def gflowdist_command(
    trainers: int, steps: int, out_dir: Path, extra: list[str], *, buffers: int = 1, coordinator: bool = True
) -> list[str]:
    ranks = trainers + buffers + int(coordinator)
    return [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(CONFIG),
        "-n",
        str(ranks),
        f"layout.trainers={trainers}",
        f"layout.buffers={buffers}",
        f"layout.coordinator={str(coordinator).lower()}",
        f"run.steps={steps}",
        f"run.log_every={LOG_EVERY}",
        f"run.out_dir={out_dir}",
        f"params.trajectories_per_step={BATCH}",
        f"params.l1_window={WINDOW}",
        f"run.name=bench-{trainers}t",
        *extra,
    ]


def run_gflowdist(
    trainers: int,
    steps: int,
    out_dir: Path,
    extra: list[str],
    profile: bool = False,
    *,
    buffers: int = 1,
    coordinator: bool = True,
) -> dict:
    """One ``gflowdist run`` (``trainers`` + ``buffers`` + the coordinator); the measurements read back from
    its run directory."""
    env, folder = instrumented_env(out_dir, profile)
    # every rank started cold: the loop timing is a sitecustomize, which runs as each interpreter starts, and a
    # warm rank is a fork of one that started without a rank's environment (docs/runtime.md#warm-start)
    cold = ["launch.warm_start=false", *extra]
    cmd = gflowdist_command(trainers, steps, out_dir, cold, buffers=buffers, coordinator=coordinator)
    launched = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    ended = time.time()
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    run_dir = run_directory(out.stdout)
    result = read_run(run_dir, trainers, steps)
    result.update(launched=launched, total_s=ended - launched, run_dir=str(run_dir), ranks_dir=str(folder))
    result.update(startup_timeline(run_dir, launched))
    result.update(loop_cpu(run_dir, folder, steps))
    result["traj_per_cpu_s"] = result["traj_per_s"] * result["seconds"] / result["loop_cpu_s"]
    return result


# -- the table ----------------------------------------------------------------------------------


def table(results: dict[str, list[dict]]) -> list[str]:
    """Throughput and convergence, then where a step's time goes (medians over runs)."""
    bare_rate = median(r["traj_per_s"] for r in results.get("bare", []))
    speed, where = [], []
    for name, runs in results.items():
        dist = name != "bare"
        rate = median(r["traj_per_s"] for r in runs)
        speed.append(
            [
                name,
                str(SETUPS[name][0] + 2) if dist else "1",
                spread([r["traj_per_s"] for r in runs], ".0f"),
                fmt(rate / bare_rate, ".2f") + "x" if bare_rate and rate else "-",
                fmt(median(r["traj_per_cpu_s"] for r in runs), ".0f"),
                spread([r["l1_time"] for r in runs], ".1f"),
                fmt(median(r["l1_step"] for r in runs), ".0f"),
            ]
        )
        where.append(
            [
                name,
                fmt(median(r["step_ms"] for r in runs), ".1f"),
                fmt(median(r.get("wait_ms") for r in runs), ".2f"),
                fmt(median(r.get("wait_pct") for r in runs), ".1f"),
                fmt(median(r.get("cpu_ms_trainer") for r in runs), ".1f"),
                fmt(median(r.get("cpu_ms_buffer") for r in runs), ".1f"),
                *(
                    fmt(median(r.get(f"cpu_pct_{role}") for r in runs), ".0f")
                    for role in ("trainer", "buffer", "coordinator")
                ),
                spread([first_step_s(r) for r in runs], ".1f") if dist else "-",
            ]
        )
    lines = table_lines(["setup", "ranks", "traj/s", "vs bare", "traj/CPU-s", "time to L1 s", "L1 step"], speed)
    if where:
        lines += [
            "",
            *table_lines(
                [
                    "setup",
                    "step ms",
                    "wait ms",
                    "wait %",
                    "trainer CPU ms",
                    "buffer CPU ms",
                    "trainer CPU %",
                    "buffer CPU %",
                    "coord. CPU %",
                    "startup s",
                ],
                where,
            ),
        ]
    return lines


def verdict(results: dict[str, list[dict]]) -> list[str]:
    lines = []
    bare = median(r["traj_per_s"] for r in results.get("bare", []))
    single = "1T no replay" if results.get("1T no replay") else "1T"
    one = median(r["traj_per_s"] for r in results.get(single, []))
    three = median(r["traj_per_s"] for r in results.get("3T", []))
    if bare and one:
        cpu = {name: median(r["traj_per_cpu_s"] for r in results[name]) for name in ("bare", single)}
        trainer = {name: median(r["cpu_ms_trainer"] for r in results[name]) for name in ("bare", single)}
        lines.append(
            f"framework overhead ({single} vs bare): {100 * (bare / one - 1):+.1f}% wall time per "
            f"trajectory (target < 10%); CPU per trajectory {100 * (cpu['bare'] / cpu[single] - 1):+.1f}% "
            f"for the whole job, {100 * (trainer[single] / trainer['bare'] - 1):+.1f}% for the trainer"
        )
    if three:
        lo, hi = TORCHGFN_TRAJ_PER_S
        lines.append(f"3T: {three:.0f} traj/s = {three / hi:.2f}-{three / lo:.2f}x torchgfn's {lo}-{hi} (target >= 2x)")
    waits = [
        median(r["wait_pct"] for r in runs) for name, runs in results.items() if name in ("1T", "2T", "3T") and runs
    ]  # the setups that replay with the default prefetch
    if waits:
        lines.append(f"wait_replay: {max(waits):.1f}% of a trainer's step at most (target < 5%)")
    rtt = results.get("3T rtt")
    if rtt:
        lines.append(
            f"buffer round trip (3T, prefetch 0): {median(r['wait_ms'] for r in rtt):.2f} ms "
            f"(torchgfn: ~{TORCHGFN_BUFFER_RTT_MS:.0f} ms)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="bare and 1T only, 20 steps, 1 repeat")
    parser.add_argument("--repeats", type=int, help="runs per setup (default 2, quick 1)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 400, quick 20)")
    parser.add_argument("--setups", help="comma list of bare,1T,2T,3T,3T rtt (default: all)")
    parser.add_argument("--profile", action="store_true", help="cProfile every rank (see the run directories)")
    parser.add_argument("--out-dir", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--bare-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 400)
    if args.bare_worker:
        bare_worker(steps)
        return 0
    repeats = args.repeats or (1 if args.quick else 2)
    names = args.setups.split(",") if args.setups else (["bare", "1T"] if args.quick else ["bare", *SETUPS])
    unknown = [n for n in names if n != "bare" and n not in SETUPS]
    if unknown:
        parser.error(f"unknown setups {unknown}; choose from bare, {', '.join(SETUPS)}")
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-bench-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    loads = [os.getloadavg()[0]]
    results: dict[str, list[dict]] = {n: [] for n in names}
    began = time.monotonic()
    for _ in range(repeats):
        for name in names:
            if name == "bare":
                results[name].append(run_bare(steps))
            else:
                trainers, extra = SETUPS[name]
                results[name].append(run_gflowdist(trainers, steps, out_dir, extra, profile=args.profile))
            loads.append(os.getloadavg()[0])
    print(
        f"HyperGrid D=2 H=8, 16 trajectories/trainer/step, MLP 2x64, {steps} steps, {repeats} run(s) per setup "
        f"(median, (min-max)); {load_average()}; 1-min load during the runs "
        f"{min(loads):.2f}-{max(loads):.2f}; {time.monotonic() - began:.0f} s"
    )
    print("\n".join(table(results)))
    for line in verdict(results):
        print(line)
    print(f"run directories under {out_dir}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
