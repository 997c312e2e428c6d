"""A 4-rank run (mpiexec -n 4) recorded with its trace, replayed to the bit, compared with an unforced run, and
replayed with an injected divergence, which is named.

One recorded run serves every assertion; the four launches run two at a time (the time budget of these tests).
A changed role file's warning is checked without a launch.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from gflowdist.cli.replay_cmd import _check_recording
from gflowdist.config import Config
from gflowdist.rundir import write_config
from gflowdist.runtime.tape import RecordingTape, recording_path
from tests.support.jobs import TOY, read_json

STEPS = 8  # the toy trainers ship 8 trajectories a step (toy.yaml's params.n)
#: under load two jobs share two cores: liveness must not mistake a slow rank for a lost one
PATIENT = "faults.peer_timeout_s=30"


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


def _check_trace(run: Path) -> None:
    trace = read_json(run / "trace.json")
    events = trace["traceEvents"]
    tracks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(tracks) == [0, 1, 2, 3]
    assert tracks[0].startswith("rank 0 trainer @") and tracks[2].startswith("rank 2 buffer @")
    assert tracks[3].startswith("rank 3 coordinator @")
    busy = Counter(e["pid"] for e in events if e["ph"] == "X")
    assert all(busy[rank] > 0 for rank in range(4)), busy
    starts = Counter(e["id"] for e in events if e["ph"] == "s")
    ends = Counter(e["id"] for e in events if e["ph"] == "f")
    assert starts and starts == ends and set(starts.values()) == {1}  # every arrow has one tail and one head
    arrows = {(e["id"], e["ph"]): e["pid"] for e in events if e["ph"] in "sf"}
    assert {(arrows[(i, "s")], arrows[(i, "f")]) for i in starts} >= {(0, 2), (2, 0), (1, 2), (0, 3)}
    gradients = [e for e in events if e.get("cat") == "collective" and e["name"] == "gradients"]
    assert len(gradients) == 2 * STEPS and all(e["args"]["last_arriver"] in (0, 1) for e in gradients)


def test_a_recorded_run_replays_to_the_bit_and_a_divergence_is_named(job_factory) -> None:
    recorded = job_factory(f"run.steps={STEPS}", PATIENT, "run.trace=true", "--record")
    unforced = job_factory(f"run.steps={STEPS}", PATIENT)  # the same config and seed; timing decides
    assert recorded.wait(180) == 0, recorded.output
    assert unforced.wait(180) == 0, unforced.output
    run = recorded.run_dir()
    _check_trace(run)
    report = read_json(run / "report.json")
    names = {c["name"]: c for c in report["collectives"]}
    assert names["gradients"]["count"] == STEPS and names["gradients"]["straggler"] in (0, 1)
    assert any(label.startswith("collective:") for peers in report["waits"]["seconds"].values()
               for labels in peers.values() for label in labels)

    replay = job_factory(str(run), command="replay", config=None)
    diverged = job_factory(str(run), command="replay", config=None, env={"GFLOWDIST_TEST_PERTURB": "1:3"})
    assert replay.wait(180) == 0, replay.output
    assert "gflowdist: replay identical" in replay.output
    replayed = Path(read_json(next((run / "replays").glob("*/replay.json")))["replayed"])
    assert _metrics(replayed) == _metrics(run) and len(_metrics(run)) >= 4
    assert read_json(replayed / "ledger.json")["per_rank"] == read_json(run / "ledger.json")["per_rank"]
    assert _metrics(unforced.run_dir()) != _metrics(run)  # so the replay's equality proves something

    assert diverged.wait(180) != 0
    # rank 1's batch of policy version 3 (trajectories 24..31) changed: rank 1 names itself before sending it
    assert "replay diverged on rank 1 (trainer on" in diverged.output, diverged.output
    assert "at trajectory 24: BATCH check" in diverged.output
    assert recorded.no_process_left() and diverged.no_process_left()


def test_a_role_file_changed_since_the_recording_is_named(tmp_path, capsys) -> None:
    config = Config.from_yaml(TOY, overrides=["run.record=true", "launch.nprocs=4"])
    write_config(tmp_path, config, 4, "mpi")
    roles = str(TOY.parent / "toy_roles.py")
    for rank in range(4):
        RecordingTape(recording_path(tmp_path, rank), {"files": {roles: "0" * 64}}).close()
    _check_recording(tmp_path)
    assert f"{roles} changed since the recording (SHA-256)" in capsys.readouterr().err
