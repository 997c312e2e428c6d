"""Where distribution pays: latency-bound CartPole (Ape-X, IMPALA) and oracle-bound HyperGrid against one process.

    python benchmarks/latency.py                  # full: time to 475; about an hour on 2 idle cores (IMPALA to 475)
    python benchmarks/latency.py --quick          # shorter: target return 150, fewer HyperGrid steps
    python benchmarks/latency.py --smoke --actors 2 --target-actors 2 --impala-actors 2 --gfn-actors 1   # the smoke test

Every figure is a ratio to a baseline measured in the same run, on the
same machine, with the same simulated slow work (gflowdist.simulation):

**CartPole, 2 ms per environment step** (``params.env_latency_s``: each
step waits, as a remote simulator does; ``SlowEnv``):

- ``single process``: ``examples/apex_cartpole/single_process.py`` with
  one actor's environments (``params.envs_per_actor``, 4), acting and
  learning in turn at ``params.env_steps_per_update`` (16) environment
  steps per learner step;
- ``Ape-X N``: ``gflowdist run examples/apex_cartpole/config.yaml`` with
  ``N`` actors of 4 environments each (N + 3 ranks), actors unpaced (flat
  out, as in the Ape-X paper), every other setting the same.

  **env steps/s**: the single process's environment steps over its
  training time; an Ape-X run's: the sum over its actors of (last - first
  reported ``env_steps``) / (the time between those reports).
  **time to target**: training start to the first greedy evaluation (10
  episodes, every 500 learner steps, without the latency) whose mean return
  reaches the target (475; ``--quick`` 150). **actor waiting**: the share
  of an actor's time spent in the simulated environment wait (its
  ``env_wait_s`` metric over time, mean over the actors): 100% is
  latency-bound, less is time spent computing or waiting for a core. ``actorsN`` = Ape-X N's env
  steps/s / the single process's; ``time_to_target`` = Ape-X
  ``--target-actors``'s time / the single process's (below 1: faster).

**IMPALA on CartPole, 2 ms per environment step** (``--impala-actors``,
default 1,2,4,8): ``examples/impala_cartpole``'s single process with one
actor's environments (its ``single_process.py``: the baseline of these rows)
against ``gflowdist run examples/impala_cartpole/config.yaml`` with ``N``
unroll actors (N + 3 ranks), on-policy as the example is (each actor waits
for the learner step that uses its unroll). Its learner batch is the
example's 16 unrolls, or one rollout of every actor (N x 8) where that is
more: on-policy, a smaller one leaves an actor no whole rollout to send.
The same columns as Ape-X's,
each against the IMPALA baseline; its learner steps take 16 unrolls of 32
steps each, so it evaluates every 25 of them (``--quick`` 10).

**HyperGrid, 10 ms per oracle call** (``params.oracle_latency_s``, one call
per batch of 16 trajectories; ``RewardOracle``):

- ``bare``: ``examples/hypergrid/bare.py``, one process sampling, waiting
  on the oracle, learning;
- ``1T + kA``: 1 trainer that only learns (``params.trainer_samples:
  false``, ``replay.learner_batch`` 32 replayed trajectories per step,
  ``--gfn-batch``), k actors (``--gfn-actors``, default 2) that sample and
  wait on the oracle and get the trainer's weights every 4 of its steps
  (``--gfn-weights-every``), 1 buffer of 2,000 trajectories, the
  coordinator. The actors sample more than one learner consumes, so the
  learner takes twice bare's batch: on 2 cores the learner's CPU, not the
  data, sets the pace.

  **traj/s**: trajectories scored by the oracle per second of training.
  **time to L1**: training start to the first logged point where the L1 of
  the recent terminal states is <= 0.5 (bare: its last 2,000; with actors:
  every actor's last 2,000 / k, reported every 5 rollouts). ``oracle`` =
  the actors' time to L1 / bare's.

**Central inference** (``benchmarks/inference_compare.py``; docs/inference.md):
Ape-X actors with their own forward against actors whose forward runs on one
inference rank (``layout.inference: 1``), at equal rank counts
(``--inference-actors`` N: N own-forward actors, or N - 1 actors + 1 inference
rank, at ``inference.split`` 1 and 2), with policies whose forward dominates (3 x
1024 and 3 x 512 MLPs, ``--inference-hidden``; no simulated latency). ``inference`` =
the default split's (1) env steps/s / the own-forward run's, at the first width.

**The peer** (``benchmarks/latency_peer.py``, ``benchmarks/rllib_peer.py``):
RLlib's APPO on the new API stack (ray 2.60.0 in a virtual environment of
its own that the benchmark builds on first use, ``--peer-venv``; never a
dependency of gflowdist) on the same CartPole, 2 ms per step, with
``--peer-actors`` env runners (default 4) of 4 environments each, the
process count of the ``Ape-X --peer-actors`` row; greedy evaluations of 10
episodes without the latency, as gflowdist's coordinator's. ``rllib`` =
that Ape-X row's env steps/s / RLlib's (``failed`` when the peer could not
be built or run: the reason is printed; ``not-run`` with ``--no-peer``).

The last line sums up, for scripts::

    latency: actors4 3.61x actors8 6.20x time_to_target 0.42x oracle 0.37x inference 1.55x rllib 1.70x

(``-`` where a figure was not measured: an actor count left out, a target
not reached). ``--plot`` draws env steps/s against actors with the ideal
line (N x one actor), a panel for Ape-X and one for IMPALA when it ran; ``--replot JSON --plot PNG``
draws it again from a run's ``--json`` file. The 1-minute load average (``uptime``) is printed
with every figure: the machine is shared, and a latency-bound layout's
gain depends on the cores the other jobs leave it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inference_compare
import latency_peer
from gflowdist.timing.text_table import table_lines
from inference_compare import summed_rate
from latency_impala import run_impala, run_impala_single
from latency_jobs import load1, metric_rows, run_env_job, where_time_goes
from latency_tables import (
    cartpole_table,
    fmt,
    hypergrid_table,
    load_cell,
    plot,
    summary_line,
    where_lines,
)
from run_reading import child_env, load_average, parse_result, run_directory

ROOT = Path(__file__).resolve().parents[1]
APEX = ROOT / "examples" / "apex_cartpole"
HYPERGRID = ROOT / "examples" / "hypergrid"
ENV_LATENCY_S = 0.002
ORACLE_LATENCY_S = 0.010
L1_TARGET = 0.5
L1_WINDOW = 2000
BATCH = 16
#: mode -> CartPole target return, Ape-X run.steps cap, HyperGrid steps (bare) / learner steps (actors)
MODES = {
    "full": {"target": 475.0, "apex_steps": 20000, "gfn_steps": 1000, "budget_s": 600.0, "eval_every": 500},
    "quick": {"target": 150.0, "apex_steps": 4000, "gfn_steps": 400, "budget_s": 180.0, "eval_every": 500},
    # the CI smoke test: every path once, nothing converges (a target of 40 is a few evaluations away)
    "smoke": {"target": 40.0, "apex_steps": 300, "gfn_steps": 40, "budget_s": 60.0, "eval_every": 100},
}
#: learner steps of each central-inference run, by mode
INFERENCE_STEPS = {"full": 600, "quick": 300, "smoke": 40}


# -- CartPole -----------------------------------------------------------------------------------


def cartpole_overrides(latency_s: float, mode: dict) -> list[str]:
    return [
        f"params.env_latency_s={latency_s}",
        f"params.target_return={mode['target']}",
        f"sync.weights_to_coordinator_every={mode['eval_every']}",
        "run.log_every=10",
    ]


def single_worker(overrides: list[str], budget_s: float) -> None:
    """In this process: single_process.train; RESULT with its rates."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(APEX))
    import single_process

    config = single_process.Config.from_yaml(APEX / "config.yaml", overrides)
    result = single_process.train(config, time_budget_s=budget_s, log=lambda line: None)
    print("RESULT " + json.dumps(result), flush=True)


def run_single(latency_s: float, mode: dict) -> dict:
    overrides = [*cartpole_overrides(latency_s, mode), "layout.actors=1"]
    cmd = [sys.executable, __file__, "--single-worker", json.dumps(overrides), "--budget", str(mode["budget_s"])]
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=mode["budget_s"] + 120, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"single process failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = parse_result(out.stdout)
    solved = next((p for p in result["curve"] if p["eval_return"] >= mode["target"]), None)
    return {
        "name": "single process",
        "actors": 0,
        "env_per_s": result["env_steps_per_s"],
        "time_to_target": solved["seconds"] if solved else None,
        "learner_steps": solved["learner_steps"] if solved else result["learner_steps"],
        "train_s": result["seconds"],
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
    }


def run_apex(actors: int, latency_s: float, mode: dict, out_dir: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(APEX / "config.yaml"),
        "-n",
        str(actors + 3),
        f"layout.actors={actors}",
        f"run.steps={mode['apex_steps']}",
        f"run.out_dir={out_dir}",
        f"run.name=latency-apex-{actors}",
        "params.env_steps_per_update=null",
        *cartpole_overrides(latency_s, mode),
    ]
    return run_env_job(f"Ape-X {actors}", actors, cmd, mode["budget_s"] + 300)


# -- HyperGrid ----------------------------------------------------------------------------------


def bare_worker(steps: int, latency_s: float) -> None:
    """In this process: bare.train with the oracle; RESULT with the time of every logged row."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(HYPERGRID))
    import bare

    marks: dict[str, float] = {}
    rows: list[float] = []
    sample = bare.sample_trajectories

    def timed_sample(model, env, n, *args, **kwargs):
        if n != L1_WINDOW and "start" not in marks:  # the first training step (the probe draws L1_WINDOW)
            marks["start"] = time.perf_counter()
        return sample(model, env, n, *args, **kwargs)

    bare.sample_trajectories = timed_sample
    bare.print = lambda *a, **k: rows.append(time.perf_counter())
    args = bare.Args(
        n_steps=steps, batch_size=BATCH, log_every=5, exact_max_states=0, window=L1_WINDOW, oracle_latency_s=latency_s
    )
    m = bare.train(args)
    l1 = [(t - marks["start"], row["l1"]) for row, t in zip(m["history"], rows, strict=True)]
    print("RESULT " + json.dumps({"traj_per_s": m["traj_per_s"], "seconds": m["seconds"], "l1": l1}), flush=True)


def run_bare(latency_s: float, mode: dict) -> dict:
    cmd = [sys.executable, __file__, "--bare-worker", "--steps", str(mode["gfn_steps"]), "--latency", str(latency_s)]
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"bare worker failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result = parse_result(out.stdout)
    return {
        "name": "bare",
        "ranks": 1,
        "traj_per_s": result["traj_per_s"],
        "time_to_l1": next((t for t, l1 in result["l1"] if l1 <= L1_TARGET), None),
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
    }


def run_gfn_actors(
    actors: int, latency_s: float, mode: dict, out_dir: Path, learner_batch: int = BATCH, weights_every: int = 1
) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "gflowdist",
        "run",
        str(HYPERGRID / "config.yaml"),
        "-n",
        str(actors + 3),
        "layout.trainers=1",
        f"layout.actors={actors}",
        f"run.steps={mode['gfn_steps']}",
        "run.log_every=5",
        f"run.out_dir={out_dir}",
        f"run.name=latency-gfn-{actors}",
        "replay.replay_fraction=0",
        f"replay.learner_batch={learner_batch}",
        f"sync.weights_to_actors_every={weights_every}",
        "replay.capacity=2000",
        "replay.min_size_to_sample=64",
        "params.trainer_samples=false",
        f"params.trajectories_per_step={BATCH}",
        f"params.l1_window={L1_WINDOW // actors}",
        f"params.oracle_latency_s={latency_s}",
    ]
    began, load = time.monotonic(), load1()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=child_env())
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    run_dir = run_directory(out.stdout)
    finals = json.loads((run_dir / "finals.json").read_text())
    actor_ranks = {int(rank) for rank, f in finals.items() if f["role"] == "actor"}
    rows = metric_rows(run_dir)
    return {
        "name": f"1T + {actors}A",
        "ranks": actors + 3,
        "traj_per_s": summed_rate(rows, actor_ranks, "trajectories"),
        "time_to_l1": first_time_all_below(rows, actor_ranks),
        "wall_s": time.monotonic() - began,
        "load": (load, load1()),
        "where": where_time_goes(finals),
        "run_dir": str(run_dir),
    }


def first_time_all_below(rows: list[dict], ranks: set[int]) -> float | None:
    """The first row time at which every rank of ``ranks`` has reported, the latest ``l1`` each <= target."""
    latest: dict[int, float] = {}
    for row in rows:
        if row["rank"] in ranks and "l1" in row:
            latest[row["rank"]] = row["l1"]
            if len(latest) == len(ranks) and max(latest.values()) <= L1_TARGET:
                return row["time"]
    return None


# -- main ---------------------------------------------------------------------------------------


def replot(saved: Path, picture: str | None) -> int:
    """``--replot``: the scaling picture of an earlier run's ``--json`` file (its title says so)."""
    if not picture:
        print("--replot needs --plot PNG (where to draw)", file=sys.stderr)
        return 2
    runs = json.loads(saved.read_text())
    if runs.get("single") is None or not runs.get("apex"):
        print(f"{saved}: no CartPole section (single process and Ape-X rows) to draw", file=sys.stderr)
        return 2
    title = f"CartPole, {1e3 * ENV_LATENCY_S:g} ms/step; redrawn from {saved.name}"
    plot(runs["single"], runs["apex"], Path(picture), title, runs.get("impala_single"), runs.get("impala") or [])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="target return 150, 400 HyperGrid steps")
    parser.add_argument(
        "--smoke", action="store_true", help="scaled down further for the CI smoke test (implies --no-peer)"
    )
    parser.add_argument("--actors", default="1,2,4,8", help="Ape-X actor counts (default 1,2,4,8)")
    parser.add_argument("--target-actors", type=int, default=8, help="the Ape-X run of time_to_target (default 8)")
    parser.add_argument("--impala-actors", default="1,2,4,8", help="IMPALA actor counts (default 1,2,4,8)")
    parser.add_argument("--gfn-actors", default="2", help="HyperGrid actor counts beside 1 trainer (default 2)")
    parser.add_argument("--gfn-batch", type=int, default=2 * BATCH, help="the HyperGrid learner's replayed batch")
    parser.add_argument("--gfn-weights-every", type=int, default=4, help="HyperGrid sync.weights_to_actors_every")
    parser.add_argument("--no-peer", action="store_true", help="leave out the RLlib peer (the CI smoke test)")
    parser.add_argument("--peer-actors", type=int, default=4, help="RLlib env runners, against Ape-X this many")
    parser.add_argument(
        "--peer-learners", type=int, default=0, help="RLlib learner actors (0: its default local learner)"
    )
    parser.add_argument("--peer-venv", type=Path, default=latency_peer.DEFAULT_VENV, help="the peer's environment")
    parser.add_argument(
        "--inference-actors",
        type=int,
        default=4,
        help="central inference: N own-forward actors against N - 1 actors + 1 inference rank (default 4)",
    )
    parser.add_argument(
        "--inference-hidden",
        default=",".join(str(h) for h in inference_compare.HIDDEN),
        help="central inference: the policies' hidden widths (3 layers each), the first the summary's",
    )
    parser.add_argument(
        "--skip", default="", help="comma list of sections to leave out: cartpole, impala, hypergrid, inference"
    )
    parser.add_argument("--plot", help="write the scaling picture (env steps/s against actors) to this PNG")
    parser.add_argument("--out-dir", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--json", help="also write every measurement to this file")
    parser.add_argument("--replot", metavar="JSON", help="only draw --plot from an earlier run's --json file (no runs)")
    args = parser.parse_args()
    if args.replot:
        return replot(Path(args.replot), args.plot)
    mode_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    mode = MODES[mode_name]
    args.no_peer = args.no_peer or args.smoke
    skip = set(filter(None, args.skip.split(",")))
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="gflowdist-latency-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    print(f"start: {load_average()}", flush=True)
    single, apex, bare, gfn, inference, peer = None, [], None, [], [], None
    impala_single, impala = None, []
    if "cartpole" not in skip:
        single = run_single(ENV_LATENCY_S, mode)
        print(f"  single process: {json.dumps(single)}", flush=True)
        for actors in [int(a) for a in args.actors.split(",")]:
            apex.append(run_apex(actors, ENV_LATENCY_S, mode, out_dir))
            print(f"  Ape-X {actors}: {json.dumps({k: v for k, v in apex[-1].items() if k != 'where'})}", flush=True)
        if not args.no_peer:
            peer = latency_peer.run(
                args.peer_actors, args.peer_venv, mode, ENV_LATENCY_S, out_dir, load1, args.peer_learners
            )
    if "impala" not in skip:
        impala_single = run_impala_single(ENV_LATENCY_S, mode, mode_name)
        print(f"  single process (IMPALA): {json.dumps(impala_single)}", flush=True)
        for actors in [int(a) for a in args.impala_actors.split(",")]:
            impala.append(run_impala(actors, ENV_LATENCY_S, mode, mode_name, out_dir))
            print(f"  IMPALA {actors}: {json.dumps({k: v for k, v in impala[-1].items() if k != 'where'})}", flush=True)
    if "hypergrid" not in skip:
        bare = run_bare(ORACLE_LATENCY_S, mode)
        print(f"  bare: {json.dumps(bare)}", flush=True)
        for actors in [int(a) for a in args.gfn_actors.split(",")]:
            gfn.append(run_gfn_actors(actors, ORACLE_LATENCY_S, mode, out_dir, args.gfn_batch, args.gfn_weights_every))
            print(f"  1T + {actors}A: {json.dumps({k: v for k, v in gfn[-1].items() if k != 'where'})}", flush=True)
    if "inference" not in skip:
        inference = inference_compare.run_pair(
            args.inference_actors,
            INFERENCE_STEPS[mode_name],
            out_dir,
            load1,
            child_env,
            tuple(int(h) for h in args.inference_hidden.split(",")),
        )
        for run in inference:
            print(f"  {run['name']}: {json.dumps(run)}", flush=True)
    print()
    if single is not None:
        print(
            f"CartPole-v1, {1e3 * ENV_LATENCY_S:g} ms per environment step (simulated wait), "
            f"target return {mode['target']:g}; Ape-X actors unpaced; load = 1-min load average before-after"
        )
        peer_rows = [peer["row"]] if peer and "row" in peer else []
        print("\n".join(cartpole_table(single, apex, peer_rows)))
    if impala_single is not None:
        print()
        print(
            f"IMPALA, CartPole-v1, {1e3 * ENV_LATENCY_S:g} ms per environment step, target return {mode['target']:g}; "
            "on-policy (each actor waits for the learner step that uses its unroll); baseline: the example's "
            "single process with one actor's environments (params.envs_per_actor)"
        )
        print("\n".join(cartpole_table(impala_single, impala)))
    if bare is not None:
        print()
        print(
            f"HyperGrid 8x8, {1e3 * ORACLE_LATENCY_S:g} ms per oracle call of {BATCH} trajectories, L1 <= {L1_TARGET}"
        )
        print("\n".join(hypergrid_table(bare, gfn)))
    if inference:
        print()
        print(
            "Central inference: CartPole-v1 without latency, MLP Q-networks of 3 hidden layers (their forward "
            "dominates an own-forward actor's CPU), actors unpaced, equal rank counts; vs own = against the "
            "own-forward run of the same width; batch obs = mean observations per forward, queue ms = mean "
            "queueing delay"
        )
        print("\n".join(inference_compare.table(inference, table_lines, fmt, load_cell)))
    print()
    print("where the time goes (share of each role's timed phases, from finals.json):")
    print("\n".join(where_lines([*apex, *impala, *gfn])) or "  -")
    print(latency_peer.lines(peer, apex, args.peer_actors, args.no_peer))
    print(f"end: {load_average()}; {time.monotonic() - began:.0f} s; run directories under {out_dir}")
    if args.plot and single is not None and apex:
        title = f"CartPole, {1e3 * ENV_LATENCY_S:g} ms/step; {load_average()}"
        plot(single, apex, Path(args.plot), title, impala_single, impala)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "single": single,
                    "apex": apex,
                    "impala_single": impala_single,
                    "impala": impala,
                    "bare": bare,
                    "gfn": gfn,
                    "inference": inference,
                    "peer": peer,
                },
                indent=1,
            )
        )
    empty = {"actors": 0, "env_per_s": None, "time_to_target": None}
    print(summary_line(single or empty, apex, args.target_actors, bare, gfn, inference, peer, args.peer_actors))
    return 0


if __name__ == "__main__":
    if "--single-worker" in sys.argv:
        index = sys.argv.index("--single-worker")
        single_worker(json.loads(sys.argv[index + 1]), float(sys.argv[sys.argv.index("--budget") + 1]))
    elif "--bare-worker" in sys.argv:
        bare_worker(int(sys.argv[sys.argv.index("--steps") + 1]), float(sys.argv[sys.argv.index("--latency") + 1]))
    else:
        sys.exit(main())
