"""benchmarks/latency_peer.py and rllib_peer.py: the RLlib peer's plumbing, without ray.

ray is never installed for these tests: the peer's own script is imported
here only for its environment wrapper and its settings, the runner is
driven with stand-in peer scripts (real processes: one that leaves a child
behind, one that never ends), and the venv builder with a base python that
fails.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import gymnasium
import pytest

from gflowdist.process_tree import is_running
from gflowdist.rl.slow_env import SlowEnv
from tests.test_benchmarks_smoke import load
from tests.test_latency_benchmark import LAST_LINE

PEER_RESULT = {
    "ok": True,
    "algo": "APPO",
    "settings": {"runners": 4},
    "env_per_s": 400.0,
    "time_to_target": 200.0,
    "train_s": 200.0,
    "wall_s": 260.0,
}


def test_the_peers_wrapper_waits_as_gflowdists_slowenv(monkeypatch):
    peer = load("rllib_peer")
    waits: list[tuple[str, float]] = []
    who = ["peer"]
    monkeypatch.setattr(time, "sleep", lambda s: waits.append((who[0], s)))
    ours = SlowEnv(gymnasium.make("CartPole-v1"), latency_s=0.002)
    theirs = peer.slow_cartpole_class()({"latency_s": 0.002})
    trajectories = {}
    for name, env in (("gflowdist", ours), ("peer", theirs)):
        who[0] = name
        obs, _ = env.reset(seed=3)
        seen = [obs.tolist()]
        for step in range(12):
            obs, reward, terminated, truncated, _ = env.step(step % 2)
            seen.append([*obs.tolist(), reward, terminated, truncated])
        trajectories[name] = seen
    assert trajectories["peer"] == trajectories["gflowdist"]  # the same episode: only time passes
    assert [s for w, s in waits if w == "gflowdist"] == [0.002] * 12  # one wait per step, none on reset
    assert [s for w, s in waits if w == "peer"] == [0.002] * 12


def test_peer_settings_name_an_unknown_key():
    peer = load("rllib_peer")
    assert peer.settings('{"runners": 2}')["runners"] == 2
    assert peer.settings("{}")["latency_s"] == 0.002
    with pytest.raises(ValueError, match=r"unknown peer setting\(s\) \['runner'\]"):
        peer.settings('{"runner": 2}')


def test_parse_result_reads_the_peers_json_and_names_its_failure():
    lp = load("latency_peer")
    assert lp.parse_result(json.dumps(PEER_RESULT))["env_per_s"] == 400.0
    failed = {
        "ok": False,
        "error": "RuntimeError: raylet died",
        "trace": "Traceback\n  line\nRuntimeError: raylet died",
    }
    with pytest.raises(lp.PeerUnavailable, match="RLlib failed in the peer: RuntimeError: raylet died") as caught:
        lp.parse_result(json.dumps(failed))
    assert str(caught.value).splitlines()[-1] == "RuntimeError: raylet died"  # the trace's last lines follow
    with pytest.raises(lp.PeerUnavailable, match=r"in the peer \(ray's logs: /tmp/gflowdist-ray-x\): Runtime"):
        lp.parse_result(json.dumps({**failed, "ray_dir": "/tmp/gflowdist-ray-x"}))
    with pytest.raises(lp.PeerUnavailable, match="not JSON"):
        lp.parse_result("{half")
    with pytest.raises(lp.PeerUnavailable, match="bad env_per_s: -1"):
        lp.parse_result(json.dumps({**PEER_RESULT, "env_per_s": -1}))


def test_summary_line_with_and_without_the_peer():
    bench, lp = load("latency"), load("latency_peer")
    single = {"actors": 0, "env_per_s": 100.0, "time_to_target": 50.0}
    apex = [{"name": "Ape-X 4", "actors": 4, "env_per_s": 680.0, "time_to_target": 100.0}]
    line = bench.summary_line(single, apex, 4, None, [], [], PEER_RESULT, 4)
    assert line.endswith(" rllib 1.70x") and LAST_LINE.match(line)  # 680 / 400
    assert bench.summary_line(single, apex, 4, None, [], []).endswith(" rllib not-run")
    assert bench.summary_line(single, apex, 4, None, [], [], {"error": "no venv"}, 4).endswith(" rllib failed")
    assert bench.summary_line(single, apex, 4, None, [], [], PEER_RESULT, 8).endswith(" rllib -")  # no Ape-X 8
    assert lp.comparison_line(PEER_RESULT, apex[0]) == (
        "Ape-X 4 vs RLlib APPO 4: env steps/s 1.70x, time to target 0.50x (100.0 s against 200.0 s)"
    )
    unsolved = {**PEER_RESULT, "time_to_target": None}
    assert lp.comparison_line(unsolved, apex[0]).endswith("time to target < 0.50x (RLlib did not reach it in 200 s)")


def test_the_peer_row_joins_the_cartpole_table():
    bench, lp = load("latency"), load("latency_peer")
    single = {"name": "single process", "actors": 0, "env_per_s": 100.0, "time_to_target": 50.0, "wall_s": 60.0}
    single["load"] = (1.0, 2.0)
    lines = bench.cartpole_table(single, [], [lp.table_row(PEER_RESULT, (2.0, 3.0))])
    row = next(line for line in lines if line.startswith("RLlib APPO 4  "))
    assert row.split()[3:5] == ["400", "4.00x"]  # env steps/s, vs single


def test_a_peer_venv_that_cannot_be_built_names_the_step(tmp_path):
    lp = load("latency_peer")
    base = tmp_path / "python"
    base.write_text("#!/bin/sh\necho 'Error: ensurepip is not available' >&2\nexit 1\n")
    base.chmod(0o755)
    with pytest.raises(lp.PeerUnavailable) as caught:
        lp.ensure_venv(tmp_path / "venv", base_python=str(base), log=lambda line: None)
    message = str(caught.value)
    assert "create the virtual environment failed (exit 1)" in message
    assert message.splitlines()[-1] == "Error: ensurepip is not available"
    steps = [name for name, _ in lp.install_steps(tmp_path / "venv", "python3")]
    assert steps == ["create the virtual environment", "install torch==2.13.0", "install ray[rllib]==2.60.0"]


def stand_in(tmp_path, body: str):
    script = tmp_path / "peer.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_run_peer_reads_the_result_and_ends_what_the_peer_left(tmp_path):
    lp = load("latency_peer")
    pid_file = tmp_path / "child.pid"
    script = stand_in(
        tmp_path,
        f"""
        import json, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("peer: 1.0 s, 100 env steps, greedy return 20.0", flush=True)
        open(sys.argv[2], "w").write(json.dumps({PEER_RESULT!r}))
        """,
    )
    logged: list[str] = []
    result = lp.run_peer(sys.executable, {"runners": 4}, tmp_path / "out.json", 60, script=script, log=logged.append)
    assert result["env_per_s"] == 400.0 and result["exit"] == 0
    assert result["leftovers"] == 1  # the child the stand-in left, killed
    child = int(pid_file.read_text())
    assert not is_running(child)
    assert not os.path.exists(f"/proc/{child}")  # killed and reaped here (adopted), not left a zombie
    assert logged == ["  peer: 1.0 s, 100 env steps, greedy return 20.0"]


def test_run_peer_kills_a_peer_past_its_timeout_with_its_processes(tmp_path):
    lp = load("latency_peer")
    pid_file = tmp_path / "child.pid"
    script = stand_in(
        tmp_path,
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("starting ray", flush=True)
        time.sleep(600)
        """,
    )
    began = time.monotonic()
    with pytest.raises(lp.PeerUnavailable, match="ran past 3 s and was killed") as caught:
        lp.run_peer(sys.executable, {}, tmp_path / "out.json", 3, script=script, log=lambda line: None)
    assert time.monotonic() - began < 60
    assert str(caught.value).splitlines()[-1] == "starting ray"
    assert not is_running(int(pid_file.read_text()))


def test_run_peer_without_a_result_says_so(tmp_path):
    lp = load("latency_peer")
    script = stand_in(tmp_path, "import sys\nprint('ImportError: no module named ray')\nsys.exit(3)\n")
    with pytest.raises(lp.PeerUnavailable, match=r"wrote no result \(exit 3") as caught:
        lp.run_peer(sys.executable, {}, tmp_path / "out.json", 30, script=script, log=lambda line: None)
    assert str(caught.value).splitlines()[-1] == "ImportError: no module named ray"
    assert not os.path.exists(tmp_path / "out.json")
