"""What tracing (``run.trace``) and recording (``--record``) cost, and whether a recorded HyperGrid run replays.

    python benchmarks/record_replay.py             # 4 setups x 4 runs of 200 steps, then one replay: ~5-15 min
    python benchmarks/record_replay.py --quick     # 60 steps, 1 run each: a smoke run

Every run is ``examples/hypergrid/config.yaml`` on 4 ranks (2 trainers
averaging gradients, 1 buffer, 1 coordinator; ``benchmarks/hypergrid.py``'s
2T setup: 16 trajectories per trainer per step, seed 0, one torch thread per
process). Setups:

- ``baseline``: neither trace nor recording;
- ``trace``: ``run.trace=true`` (every phase, collective and message in a
  ring of ``run.trace_events`` per rank; trace.json written at the end);
- ``record``: ``--record`` (every choice that depends on timing, plus each
  step's loss and a CRC-32 of each shipped batch, to record/rank-N.msgpack);
- ``both``: the two together.

The setups' runs are interleaved, their order rotated each round (baseline,
trace, record, both; then trace, record, both, baseline; ...) so load drift
and a run's place in the round hit each alike. **traj/s**: trajectories / training wall
time (``benchmarks/hypergrid.py``'s definition); **traj/CPU-s**: trajectories
/ CPU seconds of every rank's role loop, which depends far less on other
processes' load than traj/s: on a shared machine it is the number to compare.
**trainer CPU ms/step**: the CPU time of a trainer's loop per step (mean over
the trainers), where recording's and tracing's work lands, and which other
ranks' polling does not blur. **cost**: ``1 - setup / baseline`` of the
medians for rates, ``setup / baseline - 1`` for CPU per step (negative:
cheaper than the baseline, i.e. noise); **paired**: the median over rounds of
each round's own ``1 - setup / baseline`` traj/s (a round's four runs follow
each other, so they share most of the machine's load). Then one recorded run is replayed with ``gflowdist
replay`` and the verdict printed (identical metrics.jsonl and ledger).

On a loaded machine the end-to-end numbers spread by tens of percent, more
than what they measure. So the script also prices the work itself, in one
process (**per step**): the microseconds each kind of event costs (the best
of several timed loops, each with and without the feature: a message taken
through the recording tape vs taken plainly, a phase with and without a
trace, a message through a traced channel, a loss check, a CRC-32 of a real
HyperGrid batch of 16 trajectories), times how many of each a trainer and the
buffer made per step in the recorded and traced runs above (counted in their
record/ files and trace.json), against the CPU milliseconds a trainer's and
the buffer's loop spent per step in the baseline runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gflowdist.timing.text_table import table_lines

HERE = Path(__file__).resolve().parent
SETUPS = {
    "baseline": ["run.trace=false"],
    "trace": ["run.trace=true"],
    "record": ["run.trace=false", "--record"],
    "both": ["run.trace=true", "--record"],
}


def _hypergrid():
    """benchmarks/hypergrid.py as a module: its run, measurement and environment helpers."""
    spec = importlib.util.spec_from_file_location("bench_hypergrid", HERE / "hypergrid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sizes(run_dir: Path) -> dict:
    record = sorted((run_dir / "record").glob("rank-*.msgpack"))
    trace = run_dir / "trace.json"
    return {
        "record_bytes": sum(p.stat().st_size for p in record),
        "trace_bytes": trace.stat().st_size if trace.exists() else 0,
    }


def best_us(fn, n: int = 2000, repeats: int = 7) -> float:
    """Microseconds per call of ``fn``: the best of ``repeats`` loops of ``n`` calls."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - started) / n)
    return 1e6 * best


def unit_costs(folder: Path) -> dict[str, float]:
    """Microseconds each recorded or traced event adds (see the module docstring)."""
    import torch

    from gflowdist.runtime.observing import TraceObserver
    from gflowdist.runtime.tape import RecordingTape, Site, batch_digest
    from gflowdist.timing import StepTimer
    from gflowdist.timing.trace import TraceRecorder
    from gflowdist.transport import Message, MessageType

    sys.path.insert(0, str(HERE.parent / "examples" / "hypergrid"))
    from hypergrid_gfn import HyperGrid, HyperGridPolicy, sample_trajectories

    message = Message(MessageType.TRAJECTORIES, 1, 7, {"n": 16})

    class Arrived:  # a channel whose next message is always there: what a take costs beyond the transport
        def try_recv(self, src=None):
            return message

    tape, observer = RecordingTape(folder / "micro.msgpack", {"rank": 0}), TraceObserver(TraceRecorder(20_000))

    def phase(timer):
        def one():
            with timer.phase("x"):
                pass

        return one

    env = HyperGrid(ndim=2, height=8)
    batch = sample_trajectories(HyperGridPolicy(env, hidden=64, n_layers=2), env, 16, torch.Generator(), 0.0)
    loss, arrived = torch.tensor(0.5), Arrived()
    costs = {
        "take_plain": best_us(lambda: arrived.try_recv()),
        "take_recorded": best_us(lambda: tape.take(Site.DATA, arrived, 0)),
        "message_traced": best_us(lambda: observer.took(message, 1, 0.0)),
        "phase_plain": best_us(phase(StepTimer())),
        "phase_traced": best_us(phase(StepTimer(trace=TraceRecorder(20_000)))),
        "loss_check": best_us(lambda: tape.check(Site.LOSS, 0, float(loss.detach()))),
        "batch_digest": best_us(lambda: tape.check(Site.BATCH, 0, batch_digest(batch)), n=500),
    }
    tape.close()
    return costs


def replay(run_dir: str) -> tuple[int, str, float]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "gflowdist", "replay", run_dir],
        capture_output=True,
        text=True,
        timeout=900,
        env=_hypergrid().child_env(),
    )
    verdict = [line for line in (out.stdout + out.stderr).splitlines() if "replay" in line and "gflowdist" in line]
    return out.returncode, verdict[-1] if verdict else out.stderr[-500:], time.monotonic() - started


def events_per_step(results: dict[str, list[dict]], steps: int) -> dict[str, dict[str, float]]:
    """Per role, per trainer step: recorded events (record/), traced spans and messages (trace.json)."""
    import json

    from gflowdist.runtime.tape import read_recording

    counts: dict[str, dict[str, list[float]]] = {}
    for run in results["both"]:
        run_dir = Path(run["run_dir"])
        finals = json.loads((run_dir / "finals.json").read_text())
        events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
        for rank, final in finals.items():
            role = counts.setdefault(final["role"], {})
            _, recorded, _ = read_recording(run_dir / "record" / f"rank-{rank}.msgpack")
            mine = [e for e in events if e.get("pid") == int(rank) and e["ph"] == "X"]
            role.setdefault("recorded", []).append(len(recorded) / steps)
            role.setdefault("spans", []).append(sum(e["cat"] != "message" for e in mine) / steps)
            role.setdefault("messages", []).append(sum(e["cat"] == "message" for e in mine) / steps)
    return {role: {k: statistics.fmean(v) for k, v in c.items()} for role, c in counts.items()}


def cost_lines(results: dict[str, list[dict]], steps: int, costs: dict[str, float]) -> list[str]:
    """What recording and tracing add to each role's CPU per trainer step (module docstring, **per step**)."""
    per_step = events_per_step(results, steps)
    take = costs["take_recorded"] - costs["take_plain"]
    span = costs["phase_traced"] - costs["phase_plain"]
    message = costs["message_traced"]  # a message event (sent or taken) on the trace
    rows = []
    for role, n in per_step.items():
        cpu_us = 1e3 * statistics.median(r.get(f"cpu_ms_{role}", float("nan")) for r in results["baseline"])
        if role == "trainer":  # its events: one loss check and one digest per step (and any stop)
            record_us = costs["loss_check"] + costs["batch_digest"] + max(n["recorded"] - 2, 0) * take
        else:
            record_us = n["recorded"] * take
        trace_us = n["spans"] * span + n["messages"] * message
        rows.append(
            [
                role,
                f"{n['recorded']:.1f}",
                f"{record_us:.1f}",
                f"{n['spans']:.1f} + {n['messages']:.1f}",
                f"{trace_us:.1f}",
                f"{cpu_us:.0f}",
                f"{100 * record_us / cpu_us:.2f}%",
                f"{100 * trace_us / cpu_us:.2f}%",
            ]
        )
    unit = ", ".join(f"{k} {v:.2f}" for k, v in costs.items())
    return [
        f"per event, us (best of 7 loops): {unit}",
        *table_lines(
            [
                "role",
                "recorded/step",
                "record us",
                "spans + messages/step",
                "trace us",
                "loop CPU us/step",
                "record",
                "trace",
            ],
            rows,
            indent="  ",
        ),
    ]


def paired_cost(runs: list[dict], baseline: list[dict]) -> float:
    """Median over rounds of ``1 - traj/s / the same round's baseline traj/s`` (runs of a round are neighbours)."""
    return statistics.median(1 - r["traj_per_s"] / b["traj_per_s"] for r, b in zip(runs, baseline, strict=False))


def table(results: dict[str, list[dict]]) -> list[str]:
    base_rate = statistics.median(r["traj_per_s"] for r in results["baseline"])
    base_cpu = statistics.median(r["traj_per_cpu_s"] for r in results["baseline"])
    base_step = statistics.median(r["cpu_ms_trainer"] for r in results["baseline"])
    rows = []
    for name, runs in results.items():
        rate = statistics.median(r["traj_per_s"] for r in runs)
        cpu = statistics.median(r["traj_per_cpu_s"] for r in runs)
        spread = f"({min(r['traj_per_s'] for r in runs):.0f}-{max(r['traj_per_s'] for r in runs):.0f})"
        step_ms = statistics.median(r["cpu_ms_trainer"] for r in runs)
        rows.append(
            [
                name,
                f"{rate:.0f} {spread}",
                f"{100 * (1 - rate / base_rate):+.1f}%",
                f"{100 * paired_cost(runs, results['baseline']):+.1f}%",
                f"{cpu:.0f}",
                f"{100 * (1 - cpu / base_cpu):+.1f}%",
                f"{step_ms:.2f}",
                f"{100 * (step_ms / base_step - 1):+.1f}%",
                f"{statistics.median(r['record_bytes'] for r in runs) / 1e3:.0f} kB",
                f"{statistics.median(r['trace_bytes'] for r in runs) / 1e6:.2f} MB",
            ]
        )
    return table_lines(
        [
            "setup",
            "traj/s (min-max)",
            "cost",
            "paired",
            "traj/CPU-s",
            "cost",
            "trainer CPU ms/step",
            "cost",
            "record/",
            "trace.json",
        ],
        rows,
        indent="  ",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="60 steps, 1 run per setup")
    parser.add_argument("--repeats", type=int, help="runs per setup (default 4, quick 1)")
    parser.add_argument("--steps", type=int, help="training steps per run (default 200, quick 60)")
    parser.add_argument("--out-dir", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--table-from", metavar="JSON", help="print the table of a run's --json file; run nothing")
    args = parser.parse_args()
    if args.table_from:
        import json

        print("\n".join(table(json.loads(Path(args.table_from).read_text()))))
        return 0
    steps = args.steps or (60 if args.quick else 200)
    repeats = args.repeats or (1 if args.quick else 4)
    hypergrid = _hypergrid()
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-record-bench-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in SETUPS}
    loads, began = [os.getloadavg()[0]], time.monotonic()
    names = list(SETUPS)
    for round_ in range(repeats):
        for name in names[round_ % 4 :] + names[: round_ % 4]:  # each setup first in turn: no place favoured
            result = hypergrid.run_gflowdist(2, steps, out_dir, SETUPS[name])
            result.update(sizes(Path(result["run_dir"])))
            results[name].append(result)
            loads.append(os.getloadavg()[0])
            print(
                f"  round {round_ + 1}/{repeats} {name:8s} {result['traj_per_s']:7.0f} traj/s (load {loads[-1]:.1f})",
                file=sys.stderr,
                flush=True,
            )  # progress: a run takes 20-60 s
    print(
        f"HyperGrid 2 trainers + buffer + coordinator (-n 4), {steps} steps, {repeats} run(s) per setup "
        f"(median); {hypergrid.load_average()}; 1-min load during the runs {min(loads):.2f}-{max(loads):.2f}; "
        f"{time.monotonic() - began:.0f} s"
    )
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(table(results)))
    print("What recording and tracing add per trainer step, priced event by event:")
    print("\n".join(cost_lines(results, steps, unit_costs(out_dir))))
    code, verdict, seconds = replay(results["record"][0]["run_dir"])
    print(f"replay of {results['record'][0]['run_dir']} ({seconds:.0f} s, exit {code}): {verdict}")
    print(f"run directories under {out_dir}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
