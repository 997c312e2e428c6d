"""Every rank's role loop timed from outside gflowdist: a ``sitecustomize.py`` put on the ranks' ``PYTHONPATH``
(``hypergrid.py``'s docstring says what it measures); nothing in gflowdist changes."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from run_reading import child_env

INSTRUMENT_VARIABLE = "GFLOWDIST_BENCH_INSTRUMENT"  # directory for per-rank JSON (and pstats)
PROFILE_VARIABLE = "GFLOWDIST_BENCH_PROFILE"  # "1": also cProfile every rank
#: Put on the ranks' PYTHONPATH as sitecustomize.py: inside an MPI rank (PMI_RANK set) it wraps the
#: role loops that gflowdist.runtime.job calls, recording their CPU and wall seconds, optionally
#: runs cProfile, and at exit writes rank-<pid>.json (and pid-<pid>.prof). Nothing else changes.
SITECUSTOMIZE = f'''"""Written by benchmarks/hypergrid.py: time the role loop of this rank (see there)."""
import atexit, json, os, resource, time

_out = os.environ.get("{INSTRUMENT_VARIABLE}")
if _out and os.environ.get("PMI_RANK") is not None:
    _record = {{"pid": os.getpid(), "rank": int(os.environ["PMI_RANK"])}}
    _profile = None
    if os.environ.get("{PROFILE_VARIABLE}") == "1":
        import cProfile
        _profile = cProfile.Profile()
        _profile.enable()
    import gflowdist.runtime.job as _job

    def _timed(name, fn):
        def wrapper(*args, **kwargs):
            cpu, wall = time.process_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _record["loop"] = name
                _record["loop_cpu_s"] = time.process_time() - cpu
                _record["loop_wall_s"] = time.perf_counter() - wall
        return wrapper

    for _name in ("run_trainer", "run_buffer", "run_actor", "run_coordinator"):
        setattr(_job, _name, _timed(_name, getattr(_job, _name)))

    def _dump():
        if _profile is not None:
            _profile.disable()
            _profile.dump_stats(os.path.join(_out, f"pid-{{os.getpid()}}.prof"))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _record["pid"] = os.getpid()  # the rank, a fork of the process that imported this (its keeper)
        _record["process_cpu_s"] = usage.ru_utime + usage.ru_stime
        with open(os.path.join(_out, f"rank-{{os.getpid()}}.json"), "w") as f:
            json.dump(_record, f)

    atexit.register(_dump)
'''


def instrumented_env(out_dir: Path, profile: bool) -> tuple[dict[str, str], Path]:
    """The ranks' environment with the loop-timing sitecustomize on PYTHONPATH, and its output folder."""
    folder = Path(tempfile.mkdtemp(prefix="ranks-", dir=out_dir))
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = child_env(**{INSTRUMENT_VARIABLE: str(folder), PROFILE_VARIABLE: "1" if profile else "0"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH", "")]))
    return env, folder


def loop_cpu(run_dir: Path, folder: Path, steps: int) -> dict:
    """Per role (mean over its ranks): CPU % of its loop (CPU s / wall s) and CPU ms per training step;
    ``loop_cpu_s``: the loops' CPU seconds summed over every rank."""
    roles = {final["pid"]: final["role"] for final in json.loads((run_dir / "finals.json").read_text()).values()}
    pct: dict[str, list[float]] = {}
    per_step: dict[str, list[float]] = {}
    total = 0.0
    for path in folder.glob("rank-*.json"):
        record = json.loads(path.read_text())
        if "loop_wall_s" in record:
            role = roles[record["pid"]]
            pct.setdefault(role, []).append(100 * record["loop_cpu_s"] / record["loop_wall_s"])
            per_step.setdefault(role, []).append(1e3 * record["loop_cpu_s"] / steps)
            total += record["loop_cpu_s"]
    return {
        **{f"cpu_pct_{role}": statistics.fmean(v) for role, v in pct.items()},
        **{f"cpu_ms_{role}": statistics.fmean(v) for role, v in per_step.items()},
        "loop_cpu_s": total,
    }
