"""The peer of benchmarks/latency.py: RLlib in a virtual environment of its own, run and read.

gflowdist never depends on ray: this module builds the peer's environment
on first use (``--peer-venv``, default ``~/.cache/gflowdist-bench/rllib-venv``:
``python -m venv``, then ``torch==2.13.0`` first, as the CPU build, then
``ray[rllib]==2.60.0`` and gymnasium), runs ``benchmarks/rllib_peer.py``
with that environment's python in a session of its own, reads the JSON it
writes, and ends every process it left (ray's gcs_server, raylet and
workers), on success, failure and timeout alike.

A peer that cannot be built or run is :class:`PeerUnavailable` with the
step and the error lines; latency.py prints them and ``rllib failed`` in
its last line instead of a ratio.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from gflowdist.process_tree import DescendantTracker, is_running, kill_group

HERE = Path(__file__).resolve().parent

RAY_VERSION = "2.60.0"
TORCH_VERSION = "2.13.0"
#: greedy evaluations of the peer, every this many seconds of its training
EVAL_EVERY_S = 10.0
DEFAULT_VENV = Path.home() / ".cache" / "gflowdist-bench" / "rllib-venv"
SCRIPT = HERE / "rllib_peer.py"
#: the variable whose value marks every process of one peer run (ray's inherit the environment)
MARK = "GFLOWDIST_PEER_RUN"
#: what the peer's environment must import, and the line it prints when it does
CHECK = "import ray, ray.rllib, torch, gymnasium; print('peer-ok', ray.__version__, torch.__version__)"


class PeerUnavailable(RuntimeError):
    """The peer could not be built or run; the message names the step and carries its error lines."""


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def install_steps(venv: Path, base_python: str) -> list[tuple[str, list[str]]]:
    """(name, command) of each step that builds ``venv``: torch pinned first (the CPU build), then RLlib."""
    pip = [str(venv_python(venv)), "-m", "pip", "install", "-q"]
    return [
        ("create the virtual environment", [base_python, "-m", "venv", str(venv)]),
        (f"install torch=={TORCH_VERSION}", [*pip, f"torch=={TORCH_VERSION}"]),
        (f"install ray[rllib]=={RAY_VERSION}", [*pip, f"ray[rllib]=={RAY_VERSION}", "gymnasium"]),
    ]


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def is_ready(venv: Path) -> bool:
    """Whether ``venv`` imports ray (the pinned version), RLlib, torch and gymnasium."""
    python = venv_python(venv)
    if not python.exists():
        return False
    out = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, timeout=300)
    words = out.stdout.split()
    return out.returncode == 0 and words[:2] == ["peer-ok", RAY_VERSION]


def ensure_venv(
    venv: Path, base_python: str = sys.executable, log: Callable[[str], None] = print, timeout_s: float = 1800
) -> Path:
    """The python of ``venv``, built first if it does not import the peer; PeerUnavailable naming the step."""
    if is_ready(venv):
        return venv_python(venv)
    log(f"peer: building {venv} (torch {TORCH_VERSION}, ray[rllib] {RAY_VERSION}; minutes, once)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    for name, command in install_steps(venv, base_python):
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise PeerUnavailable(f"the peer's environment {venv}: {name} failed: {error}") from error
        if out.returncode != 0:
            raise PeerUnavailable(
                f"the peer's environment {venv}: {name} failed (exit {out.returncode}): {' '.join(command)}\n"
                + tail(out.stderr or out.stdout)
            )
    if not is_ready(venv):
        out = subprocess.run([str(venv_python(venv)), "-c", CHECK], capture_output=True, text=True, timeout=300)
        raise PeerUnavailable(
            f"the peer's environment {venv} was built but does not import RLlib:\n" + tail(out.stderr)
        )
    return venv_python(venv)


def run_peer(
    python: Path | str,
    settings: dict,
    out_path: Path,
    timeout_s: float,
    script: Path = SCRIPT,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the peer ``script`` with ``python``; its JSON result. Every process it started is ended here.

    The script runs in a session of its own with ``MARK`` in its environment;
    its descendants are scanned while it runs, and at the end every process
    that carries the mark is ended too, so ray's processes are found even
    after they are re-parented.
    Past ``timeout_s`` everything is killed and PeerUnavailable says so;
    processes left after a normal exit are killed and listed in the result's
    ``leftovers``.
    """
    out_path.unlink(missing_ok=True)
    log_path = out_path.with_suffix(".log")
    command = [str(python), str(script), json.dumps(settings), str(out_path)]
    token = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env[MARK] = token
    began = time.monotonic()
    timed_out = False
    adopting = set_subreaper(True)  # orphans of the peer come to this process, to be killed and reaped
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        tracker = DescendantTracker(proc.pid)
        shown = 0
        try:
            while proc.poll() is None:
                tracker.scan()
                shown = show_progress(log_path, shown, log)
                if time.monotonic() - began > timeout_s:
                    timed_out = True
                    break
                time.sleep(0.5)
        finally:
            leftovers = end_all(proc, tracker, token)
            reap(leftovers)
            if adopting:
                set_subreaper(False)
    output = log_path.read_text(errors="replace")
    show_progress(log_path, shown, log)
    if timed_out:
        raise PeerUnavailable(
            f"the peer ran past {timeout_s:.0f} s and was killed with its {len(leftovers)} processes "
            f"(its output: {log_path}):\n" + tail(output)
        )
    if not out_path.exists():
        raise PeerUnavailable(f"the peer wrote no result (exit {proc.returncode}; {log_path}):\n" + tail(output))
    result = parse_result(out_path.read_text())
    result["exit"] = proc.returncode
    result["leftovers"] = len(leftovers)
    return result


def show_progress(log_path: Path, shown: int, log: Callable[[str], None]) -> int:
    """Log the peer's ``peer: `` progress lines past line ``shown`` of its output; the lines now shown."""
    text = log_path.read_text(errors="replace")
    complete = text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]
    for line in complete[shown:]:
        if line.startswith("peer: "):
            log("  " + line)
    return max(shown, len(complete))


def set_subreaper(on: bool) -> bool:
    """Make this process adopt its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``), or stop;
    False where the OS has no such feature."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0


def reap(pids: list[int]) -> None:
    """Collect the exit status of each of ``pids`` that is this process's child (adopted orphans), so
    none stays a zombie; others are left to their parents."""
    deadline = time.monotonic() + 5
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours, or already collected
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.05)


def marked(token: str) -> list[int]:
    """The running processes whose environment has ``MARK=token``: the peer's, wherever they moved."""
    needle = f"{MARK}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:  # gone, or not ours to read
                continue
            if needle in environ.split(b"\0") and is_running(int(entry)):
                found.append(int(entry))
    return found


def end_all(proc: subprocess.Popen, tracker: DescendantTracker, token: str) -> list[int]:
    """Kill the peer's session and every process of it still running (its descendants, and any process
    whose environment carries its mark, so one orphaned before a scan is found too); the pids killed."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 5
    killed: set[int] = set()
    while True:
        alive = tracker.kill(signal.SIGKILL)
        for pid in marked(token):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            alive.append(pid)
        killed.update(alive)
        if not alive or time.monotonic() > deadline:
            return sorted(killed)
        time.sleep(0.2)


def parse_result(text: str) -> dict:
    """The peer's JSON; ``ok`` false (RLlib failed inside the peer) is PeerUnavailable with its error."""
    try:
        result = json.loads(text)
    except json.JSONDecodeError as error:
        raise PeerUnavailable(f"the peer's result is not JSON ({error}): {text[:200]!r}") from error
    if not isinstance(result, dict) or "ok" not in result:
        raise PeerUnavailable(f"the peer's result has no 'ok' field: {text[:200]!r}")
    if not result["ok"]:
        logs = f" (ray's logs: {result['ray_dir']})" if result.get("ray_dir") else ""
        raise PeerUnavailable(
            f"RLlib failed in the peer{logs}: {result.get('error')}\n" + tail(result.get("trace", ""))
        )
    for key in ("env_per_s", "time_to_target"):
        value = result.get(key)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise PeerUnavailable(f"the peer's result has a bad {key}: {value!r}")
    return result


def peer_cell(peer: dict | None, ours: dict | None) -> str:
    """The summary line's ``rllib`` value: ours / RLlib's env steps/s, ``not-run``, ``failed`` or ``-``."""
    if peer is None:
        return "not-run"
    if "error" in peer:
        return "failed"
    if ours is None or not ours.get("env_per_s") or not peer.get("env_per_s"):
        return "-"
    return f"{ours['env_per_s'] / peer['env_per_s']:.2f}x"


def comparison_line(peer: dict, ours: dict | None) -> str:
    """gflowdist's row against the peer: env steps/s and time to target, both as gflowdist / RLlib."""
    name = f"RLlib {peer['algo']} {peer['settings']['runners']}"
    if ours is None:
        return f"{name}: no Ape-X run with {peer['settings']['runners']} actors to compare with (--actors)"
    env = peer_cell(peer, ours)
    ours_t, theirs_t = ours.get("time_to_target"), peer.get("time_to_target")
    if ours_t is not None and theirs_t is not None:
        time_part = f"{ours_t / theirs_t:.2f}x ({ours_t:.1f} s against {theirs_t:.1f} s)"
    elif ours_t is not None:
        time_part = f"< {ours_t / peer['train_s']:.2f}x (RLlib did not reach it in {peer['train_s']:.0f} s)"
    elif theirs_t is not None:
        time_part = f"- (gflowdist did not reach it; RLlib in {theirs_t:.1f} s)"
    else:
        time_part = "- (neither reached it)"
    return f"{ours['name']} vs {name}: env steps/s {env}, time to target {time_part}"


def table_row(peer: dict, load: tuple[float, float]) -> dict:
    """The peer as a row of latency.py's CartPole table."""
    return {
        "name": f"RLlib {peer['algo']} {peer['settings']['runners']}",
        "actors": 0,  # no 'ideal' column: the ideal line is gflowdist's
        "env_per_s": peer["env_per_s"],
        "time_to_target": peer["time_to_target"],
        "learner_steps": None,
        "wall_s": peer.get("wall_s"),
        "load": load,
    }


def run(
    actors: int, venv: Path, mode: dict, latency_s: float, out_dir: Path, load: Callable[[], float], learners: int = 0
) -> dict:
    """The RLlib peer of latency.py's ``mode`` with its table row, or ``{"error": why}`` when it could not be
    built or run (the reason is printed too)."""
    before = load()
    settings = {
        "runners": actors,
        "learners": learners,
        "envs_per_runner": 4,
        "latency_s": latency_s,
        "target": mode["target"],
        "budget_s": mode["budget_s"],
        "eval_every_s": EVAL_EVERY_S,
    }
    try:
        python = ensure_venv(venv)
        result = run_peer(python, settings, out_dir / "rllib-peer.json", mode["budget_s"] + 600)
    except PeerUnavailable as error:
        print(f"  rllib: {error}", flush=True)
        return {"error": str(error)}
    result["row"] = table_row(result, (before, load()))
    print(f"  RLlib: {json.dumps({k: v for k, v in result.items() if k not in ('curve', 'row', 'trace')})}", flush=True)
    return result


def lines(peer: dict | None, apex: list[dict], actors: int, left_out: bool) -> str:
    """What the peer gave, in words: the comparison with Ape-X ``actors``, or why it was not run."""
    if peer is None:
        return (
            "rllib: not run: left out (--no-peer)" if left_out else "rllib: not run: the CartPole section was skipped"
        )
    if "error" in peer:
        return "rllib: not run: " + peer["error"]
    ours = next((r for r in apex if r["actors"] == actors), None)
    return "rllib: " + comparison_line(peer, ours)
