"""A GPU learner fed by CPU actors and buffers: one command, one table, under 5 minutes on one GPU.

    python benchmarks/gpu.py                  # needs CUDA: without it, one line and exit 2
    python benchmarks/gpu.py --device cpu     # the same code paths with the CPU in the GPU's place
    python benchmarks/gpu.py --quick          # scaled down, the runs side by side (CI: --device cpu --quick)

Rows, each measured in this run:

* ``HyperGrid`` (1 trainer that samples and learns, 1 actor, buffer, coordinator) and ``Ape-X``
  (examples/apex_cartpole, unpaced: 1 learner, 1 actor, buffer, coordinator) with the learner on
  the device and, as the baseline, on the CPU. Actors, buffer and coordinator stay on the CPU
  (``launch.devices: [<device>, cpu, cpu, cpu]``: the trainer is local rank 0). Columns: learner
  steps/s (from its metrics rows, start-up excluded), the rate against the CPU learner, the share
  of the learner's timed phases spent moving data (``stage``: batches onto the device,
  ``publish``: weights off it), and the mean publish. ``Ape-X wide`` is the same Ape-X run with a
  1024-wide Q-network learning from 512 transitions a step (:data:`WIDE`): where the GPU's
  arithmetic outweighs its launch and copy costs.
* ``staging (default)`` / ``staging pinned`` / ``staging pageable`` / ``direct .to()``: one replayed
  batch (``--batch-mib``) to the device through :class:`gflowdist.runtime.staging.BatchStager`
  by its default (one copy per field on its side stream), with pinned buffers, with pageable
  ones, and by a plain ``tensor.to(device)``; MiB/s, against the direct copy. Pinned memory needs
  CUDA: with ``--device cpu`` the pinned row says so.
* ``2 trainers, 1 GPU``: HyperGrid with 2 trainers of one agent group on ``cuda:0`` (both), the
  averaging chosen at start-up (read back from the run's devices.json) and the steps/s per trainer
  against the 1-trainer row.

Exit status: 0 when every row was measured; 1 when any failed (the table so far, then the error);
2 without CUDA and no ``--device cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
HYPERGRID = ROOT / "examples" / "hypergrid" / "config.yaml"
APEX = ROOT / "examples" / "apex_cartpole" / "config.yaml"
sys.path.insert(0, str(ROOT / "benchmarks"))
from harness import clean_env  # noqa: E402

#: steps per run: (full, --quick)
HYPERGRID_STEPS = (400, 12)
APEX_STEPS = (600, 12)
APEX_WIDE_STEPS = (200, 6)
STAGING_ROUNDS = (200, 10)
#: the "Ape-X wide" rows: a Q-network of two 1024-wide hidden layers learning from 512 replayed transitions a step
#: (the example's own is 128 wide with 64 a step: too small for a GPU to pay, see the rows above it)
WIDE = ("params.hidden=1024", "replay.learner_batch=512")
COLUMNS = ("setup", "device", "rate", "vs baseline", "moving data", "publish ms", "note")


class BenchmarkError(RuntimeError):
    """A row could not be measured (the command, its exit status, its output's tail)."""


def devices(learner: str, ranks: int, learners: int = 1) -> str:
    """``launch.devices`` with ``learners`` trainers (local ranks 0..) on ``learner``, the rest on the CPU."""
    return "[" + ",".join([learner] * learners + ["cpu"] * (ranks - learners)) + "]"


def run_job(config: Path, ranks: int, overrides: list[str], out_dir: Path, timeout: float) -> Path:
    """``gflowdist run config -n ranks overrides...``; its run directory."""
    cmd = [sys.executable, "-m", "gflowdist", "run", str(config), "-n", str(ranks), f"run.out_dir={out_dir}"]
    cmd += overrides
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=clean_env())
    if out.returncode != 0:
        raise BenchmarkError(f"{' '.join(cmd)} failed ({out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
    marker = "gflowdist: run directory "
    for line in out.stdout.splitlines():
        if line.startswith(marker):
            return Path(line[len(marker) :].strip())
    raise BenchmarkError(f"{' '.join(cmd)} printed no run directory:\n{out.stdout[-2000:]}")


def learner_numbers(run_dir: Path) -> dict:
    """Steps/s of the trainers (mean), their data share and publish time, and the averaging chosen."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    finals = json.loads((run_dir / "finals.json").read_text())
    trainers = sorted(int(r) for r, f in finals.items() if f["role"] == "trainer")
    rates, shares, publishes = [], [], []
    for rank in trainers:
        mine = [r for r in rows if r.get("rank") == rank and "loss" in r]
        if len(mine) < 2 or mine[-1]["time"] <= mine[0]["time"]:
            raise BenchmarkError(f"{run_dir}: trainer rank {rank} left fewer than 2 metrics rows")
        rates.append((mine[-1]["step"] - mine[0]["step"]) / (mine[-1]["time"] - mine[0]["time"]))
        phases = finals[str(rank)]["timing"]["phases"]
        total = sum(sum(v) for v in phases.values())
        moving = sum(phases.get("stage", [])) + sum(phases.get("publish", []))
        shares.append(moving / total if total else 0.0)
        publishes.extend(phases.get("publish", []))
    record = json.loads((run_dir / "devices.json").read_text())
    return {
        "steps_per_s": statistics.fmean(rates),
        "data_share": statistics.fmean(shares),
        "publish_ms": 1e3 * statistics.fmean(publishes) if publishes else None,
        "averaging": record["averaging"],
        "devices": record["devices"],
    }


def hypergrid(learner: str, steps: int, out: Path, timeout: float) -> dict:
    ranks = 4  # trainer 0, actor 1, buffer 2, coordinator 3
    overrides = [
        "layout.trainers=1",
        "layout.actors=1",
        "layout.buffers=1",
        "layout.coordinator=true",
        f"run.steps={steps}",
        f"run.log_every={max(1, steps // 10)}",
        "sync.weights_to_actors_every=5",
        f"launch.devices={devices(learner, ranks)}",
        "run.name=gpu-hypergrid",
    ]
    return learner_numbers(run_job(HYPERGRID, ranks, overrides, out, timeout))


def apex(learner: str, steps: int, out: Path, timeout: float, extra: tuple[str, ...] = ()) -> dict:
    ranks = 4  # learner 0, actor 1, buffer 2, coordinator 3
    overrides = [
        "layout.actors=1",
        f"run.steps={steps}",
        f"run.log_every={max(1, steps // 10)}",
        "params.env_steps_per_update=null",  # unpaced: the learner's own rate
        "params.target_return=1000000",  # never solved: the run ends at run.steps
        "params.eval_episodes=1",
        f"sync.weights_to_coordinator_every={max(1, steps // 3)}",
        "replay.min_size_to_sample=128",
        f"launch.devices={devices(learner, ranks)}",
        "run.name=gpu-apex" + ("-wide" if extra else ""),
        *extra,
    ]
    return learner_numbers(run_job(APEX, ranks, overrides, out, timeout))


def apex_wide(learner: str, steps: int, out: Path, timeout: float) -> dict:
    """The Ape-X run with a model and batch big enough for the GPU's arithmetic to count (:data:`WIDE`)."""
    return apex(learner, steps, out, timeout, extra=WIDE)


def sharing(learner: str, steps: int, out: Path, timeout: float) -> dict:
    ranks = 4  # trainers 0-1 (one agent group), buffer 2, coordinator 3
    shared = "cuda:0" if learner.startswith("cuda") else learner
    overrides = [
        "layout.trainers=2",
        "layout.buffers=1",
        "layout.coordinator=true",
        "layout.agent_groups=1",
        "sync.mode=gradients",
        f"run.steps={steps}",
        f"run.log_every={max(1, steps // 10)}",
        f"launch.devices={devices(shared, ranks, learners=2)}",
        "run.name=gpu-shared",
    ]
    return learner_numbers(run_job(HYPERGRID, ranks, overrides, out, timeout))


def staging(device: str, mib: float, rounds: int) -> dict[str, float | None]:
    """MiB/s of one batch of ``mib`` MiB to ``device``: the stager's default (one copy per field on a side
    stream), staging through pinned and through pageable buffers, a plain ``.to()`` on the current stream."""
    from gflowdist.runtime.staging import BatchStager

    rows = int(mib * (1 << 20) / (2 * 64 * 4))
    g = torch.Generator().manual_seed(0)
    batch = {"obs": torch.randn(rows, 64, generator=g), "next_obs": torch.randn(rows, 64, generator=g)}
    nbytes = sum(t.numel() * t.element_size() for t in batch.values())
    on_cuda = device.startswith("cuda")

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    def rate(move) -> float:
        move()  # warm: buffers made, kernels loaded
        sync()
        began = time.perf_counter()
        for _ in range(rounds):
            out = move()
        sync()
        elapsed = time.perf_counter() - began
        for name, t in batch.items():  # what arrived is what was sent
            if not torch.equal(out[name].cpu(), t):
                raise BenchmarkError(f"staging to {device} changed field {name!r}")
        return nbytes * rounds / elapsed / (1 << 20)

    default = BatchStager(device, copy_on_cpu=True)
    pinned = BatchStager(device, pin_memory=True) if on_cuda else None
    pageable = BatchStager(device, pin_memory=False, copy_on_cpu=True)
    return {
        "default": rate(lambda: default.stage(batch)),
        "pinned": rate(lambda: pinned.stage(batch)) if pinned is not None else None,
        "pageable": rate(lambda: pageable.stage(batch)),
        "direct": rate(lambda: {k: v.to(device, copy=True) for k, v in batch.items()}),
        "bytes": nbytes,
    }


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def averaging_note(result: dict) -> str:
    group = result["averaging"][0]
    where = {"nccl": "nccl", "host": f"host memory on {group['engine']}", "none": "none"}[group["path"]]
    return f"averaging: {where} ({group['reason']})"


def print_table(rows: list[tuple[str, ...]], header: str) -> None:
    widths = [max(len(str(r[i])) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS) - 1)]
    print(header)
    for row in [COLUMNS, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + str(row[-1]))


def run_all(jobs: dict[tuple[str, str], tuple], out: Path, timeout: float, parallel: bool) -> dict:
    """Every job's numbers, by ``(setup, learner device)``; in parallel (``--quick``: their start-ups overlap,
    the rates are a smoke test's) or one after the other (the rates compared in the table)."""
    if not parallel:
        return {key: run(device, steps, out, timeout) for key, (run, device, steps) in jobs.items()}
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {key: pool.submit(run, device, steps, out, timeout) for key, (run, device, steps) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def measure(args: argparse.Namespace, out: Path, rows: list[tuple[str, ...]], record: dict) -> None:
    quick = int(args.quick)
    device = args.device
    baseline = device != "cpu"  # with --device cpu the learner is its own baseline: no second run
    jobs: dict[tuple[str, str], tuple] = {}
    setups = (
        ("HyperGrid", hypergrid, HYPERGRID_STEPS),
        ("Ape-X", apex, APEX_STEPS),
        ("Ape-X wide", apex_wide, APEX_WIDE_STEPS),
    )
    for name, run, steps in setups:
        jobs[(name, device)] = (run, device, steps[quick])
        if baseline:
            jobs[(name, "cpu")] = (run, "cpu", steps[quick])
    jobs[("shared", device)] = (sharing, device, HYPERGRID_STEPS[quick])
    results = run_all(jobs, out, args.timeout, parallel=args.quick)
    for name, _, _ in setups:
        mine, cpu = results[(name, device)], results.get((name, "cpu")) if baseline else None
        record[name] = {"learner": mine, "cpu": cpu}
        for where, result, base in ((device, mine, cpu), ("cpu", cpu, None)):
            if result is None:
                continue
            vs = f"{result['steps_per_s'] / base['steps_per_s']:.2f}x" if base else "baseline"
            rows.append(
                (
                    f"{name} learner steps/s",
                    where,
                    fmt(result["steps_per_s"], ".1f"),
                    vs if baseline else "(is the baseline)",
                    fmt(100 * result["data_share"], ".1f", " %"),
                    fmt(result["publish_ms"], ".2f"),
                    "stage + publish of the learner's timed phases",
                )
            )
    moved = staging(device, args.batch_mib, STAGING_ROUNDS[quick])
    record["staging"] = moved
    labels = (
        ("staging (default)", "default"),
        ("staging pinned", "pinned"),
        ("staging pageable", "pageable"),
        ("direct .to()", "direct"),
    )
    for label, key in labels:
        value = moved[key]
        vs = f"{value / moved['direct']:.2f}x" if value is not None and key != "direct" else "baseline"
        note = f"a {moved['bytes'] / (1 << 20):.1f} MiB batch, MiB/s"
        if value is None:
            vs, note = "-", "pinned memory needs CUDA: not measured with --device cpu"
        rows.append((label, device, fmt(value, ".0f"), vs, "-", "-", note))
    shared = results[("shared", device)]
    record["shared"] = shared
    one = record["HyperGrid"]["learner"]["steps_per_s"]
    rows.append(
        (
            "2 trainers, 1 GPU steps/s" if device != "cpu" else "2 trainers, 1 device steps/s",
            device if device == "cpu" else "cuda:0 x2",
            fmt(shared["steps_per_s"], ".1f"),
            f"{shared['steps_per_s'] / one:.2f}x",
            fmt(100 * shared["data_share"], ".1f", " %"),
            fmt(shared["publish_ms"], ".2f"),
            averaging_note(shared) + "; against the 1-trainer HyperGrid row",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default: needs a GPU) or cpu (the same code paths)")
    parser.add_argument("--quick", action="store_true", help="scaled down: a smoke run (CI)")
    parser.add_argument("--batch-mib", type=float, default=None, help="the staged batch's size (default 16, quick 1)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds each run may take")
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements to this file")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where the runs' directories go (default: a temporary directory, removed after a run that passed)",
    )
    args = parser.parse_args(argv)
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device {args.device!r}: cuda or cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "benchmarks/gpu.py: no CUDA device (torch.cuda.is_available() is False); --device cpu runs the same code paths"
        )
        return 2
    if args.batch_mib is None:
        args.batch_mib = 1.0 if args.quick else 16.0
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none (--device cpu)"
    header = f"benchmarks/gpu.py: GPU {gpu}; torch {torch.__version__}; load average {os.getloadavg()[0]:.2f}"
    rows: list[tuple[str, ...]] = []
    record: dict = {"gpu": gpu, "device": args.device, "quick": args.quick}
    out = args.out_dir or Path(tempfile.mkdtemp(prefix="gflowdist-gpu-"))
    began = time.monotonic()
    try:
        measure(args, out, rows, record)
    except (BenchmarkError, subprocess.TimeoutExpired, OSError, RuntimeError, KeyError, ValueError) as err:
        print_table(rows, header)
        print(f"benchmarks/gpu.py: FAILED: {err}\nbenchmarks/gpu.py: the runs' directories: {out}", file=sys.stderr)
        return 1
    if args.out_dir is None:
        shutil.rmtree(out)
    print_table(rows, header + f"; {time.monotonic() - began:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
