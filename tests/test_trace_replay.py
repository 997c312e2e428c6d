"""The HyperGrid example on 4 ranks (mpiexec -n 4) recorded with its trace, replayed to the bit, compared with
an unforced run, and replayed with an injected divergence, which is named.

One recorded run serves every assertion; the four launches run two at a time (the time budget of these tests).
The divergence: a copy of the recorded run whose config.yaml has another learning rate (the files changed since
the recording): the trainers' weights differ after the first step, so the second step's batch (trajectories
16..31) is not the recorded one, and the trainer that finds it names itself before sending it.
A changed role file's warning is checked without a launch.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

from gflowdist.cli.replay_cmd import check_recording
from gflowdist.comm.local import LocalComm
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.rundir import write_config
from gflowdist.runtime.channels import Channels
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.reporting import Reporting
from gflowdist.runtime.settings import Settings
from gflowdist.runtime.tape import RecordingTape, recording_path
from gflowdist.timing import StepTimer
from gflowdist.timing.trace import INSTANT, TraceRecorder
from tests.support.jobs import HYPERGRID, TOY, read_json
from tests.support.trace_checks import nested_on_each_track

STEPS = 10  # 16 trajectories per trainer and step (params.trajectories_per_step); sampling from step 2 on
RUN = [
    f"run.steps={STEPS}",
    "run.log_every=1",
    "faults.checkpoint_every=4",
    "faults.peer_timeout_s=30",
    "faults.preempt_grace_s=40",
]  # under load two jobs share two cores: a slow rank is not a lost one
LR = "  lr: 0.001\n"  # examples/hypergrid/config.yaml's params.lr, as the run directory's config.yaml has it


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


def _check_trace(run: Path) -> None:
    trace = read_json(run / "trace.json")
    events = trace["traceEvents"]
    tracks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(tracks) == [0, 1, 2, 3]
    assert tracks[0].startswith("rank 0 trainer @") and tracks[1].startswith("rank 1 trainer @")
    assert tracks[2].startswith("rank 2 buffer @") and tracks[3].startswith("rank 3 coordinator @")
    busy = Counter(e["pid"] for e in events if e["ph"] == "X")
    assert all(busy[rank] > 0 for rank in range(4)), busy
    assert nested_on_each_track(events)
    phases = {(e["pid"], e["name"]) for e in events if e.get("cat") == "phase"}
    assert {(0, "rollout"), (1, "loss"), (2, "insert"), (2, "sample")} <= phases, phases
    assert {(2, "idle"), (3, "idle"), (3, "collect")} <= phases, phases  # times recorded with StepTimer.record
    starts = Counter(e["id"] for e in events if e["ph"] == "s")
    ends = Counter(e["id"] for e in events if e["ph"] == "f")
    assert starts and starts == ends and set(starts.values()) == {1}  # every arrow has one tail and one head
    arrows = {(e["id"], e["ph"]): e for e in events if e["ph"] in "sf"}
    assert all(arrows[(i, "s")]["ts"] <= arrows[(i, "f")]["ts"] for i in starts)  # sent before taken
    ends_of = {(arrows[(i, "s")]["pid"], arrows[(i, "f")]["pid"]) for i in starts}
    assert ends_of >= {(0, 2), (2, 0), (1, 2), (2, 1), (0, 3), (1, 3)}, ends_of
    gradients = [e for e in events if e.get("cat") == "collective" and e["name"] == "gradients"]
    assert len(gradients) == 2 * STEPS and all(e["args"]["last_arriver"] in (0, 1) for e in gradients)
    saved = Counter((e["pid"], e["args"]["name"]) for e in events if e["ph"] == "i" and e["name"] == "checkpoint")
    names = ("gen-0000-step-000000004", "gen-0000-step-000000008", "gen-0000-final")
    # every rank saves a part of each: the trainers and the buffer at the cut, the coordinator when the first
    # part is noted, all four the final one after their loops
    assert saved == {(rank, name): 1 for rank in range(4) for name in names}, saved


def test_a_checkpoint_instant_comes_once_the_part_is_saved() -> None:
    trace = TraceRecorder(10)

    class Saver:
        def save(self, name: str) -> dict:
            assert not trace.events, "the instant came before the part was saved"
            return {"bytes": 1, "sha256": "0" * 64}

    config = Config.from_dict({"layout": {"trainers": 1, "buffers": 0, "coordinator": False}})
    context = DistributedContext.create(config.layout, comm=LocalComm())
    channels = Channels.open(context.world, Settings.of(config))
    reports = Reporting(context, 0, channels, Ledger(), StepTimer(trace=trace), Saver())  # type: ignore[arg-type]
    assert reports.save_part("gen-0000-final") == {"bytes": 1, "sha256": "0" * 64}
    assert [(e[0], e[1], e[4]) for e in trace.events] == [(INSTANT, "checkpoint", {"name": "gen-0000-final"})]


def _changed_copy(run: Path, folder: Path) -> Path:
    """A copy of the recorded run (its recording and config) whose config.yaml has another learning rate."""
    copy = folder / run.name
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("replays", "checkpoints", "trace.json"))
    config = (copy / "config.yaml").read_text()
    assert config.count(LR) == 1, config
    (copy / "config.yaml").write_text(config.replace(LR, "  lr: 0.002\n"))
    return copy


def test_a_recorded_hypergrid_run_replays_to_the_bit_and_a_divergence_is_named(job_factory, tmp_path) -> None:
    recorded = job_factory(*RUN, "run.trace=true", "--record", config=HYPERGRID)
    unforced = job_factory(*RUN, config=HYPERGRID)  # the same config and seed; timing decides
    assert recorded.wait(240) == 0, recorded.output
    assert unforced.wait(240) == 0, unforced.output
    run = recorded.run_dir()
    _check_trace(run)
    report = read_json(run / "report.json")
    names = {c["name"]: c for c in report["collectives"]}
    assert names["gradients"]["count"] == STEPS and names["gradients"]["straggler"] in (0, 1)
    assert any(
        label.startswith("collective:")
        for peers in report["waits"]["seconds"].values()
        for labels in peers.values()
        for label in labels
    )

    changed = _changed_copy(run, tmp_path)
    replay = job_factory(str(run), command="replay", config=None)
    diverged = job_factory(str(changed), command="replay", config=None)
    assert replay.wait(240) == 0, replay.output
    assert "gflowdist: replay identical" in replay.output
    replayed = Path(read_json(next((run / "replays").glob("*/replay.json")))["replayed"])
    assert _metrics(replayed) == _metrics(run) and len(_metrics(run)) == 2 * STEPS
    assert read_json(replayed / "ledger.json")["per_rank"] == read_json(run / "ledger.json")["per_rank"]
    assert _metrics(unforced.run_dir()) != _metrics(run)  # so the replay's equality proves something

    assert diverged.wait(240) == 4, diverged.output  # exit 4: a replay divergence
    assert "at trajectory 16 (step 1): BATCH check: the digest of the shipped trajectories is" in diverged.output, (
        diverged.output
    )
    assert "config.yaml changed since the recording: params.lr: 0.001 recorded, 0.002 now" in diverged.output
    assert any(f"replay diverged on rank {r} (trainer on " in diverged.output for r in (0, 1)), diverged.output
    assert recorded.no_process_left() and unforced.no_process_left()
    assert replay.no_process_left() and diverged.no_process_left()


def test_a_role_file_changed_since_the_recording_is_named(tmp_path, capsys) -> None:
    config = Config.from_yaml(TOY, overrides=["run.record=true", "launch.nprocs=4"])
    write_config(tmp_path, config, 4, "mpi")
    roles = str(TOY.parent / "toy_roles.py")
    for rank in range(4):
        RecordingTape(recording_path(tmp_path, rank), {"files": {roles: "0" * 64}}).close()
    check_recording(tmp_path)
    assert f"{roles} changed since the recording (SHA-256)" in capsys.readouterr().err


def test_a_recorded_run_with_actors_replays_to_the_bit(job_factory) -> None:
    """Actors: which weights each one took before which rollout (INBOX), and which actor a trainer sent no
    weights to because its earlier ones were still in flight (WEIGHTS), are replayed as recorded."""
    actors = [
        "layout.trainers=1",
        "layout.actors=2",
        "launch.nprocs=5",
        "run.steps=40",
        "run.log_every=5",
        "faults.peer_timeout_s=30",
        "faults.preempt_grace_s=40",
    ]
    recorded = job_factory(*actors, "--record", config=HYPERGRID)
    assert recorded.wait(240) == 0, recorded.output
    run = recorded.run_dir()
    replay = job_factory(str(run), command="replay", config=None)
    assert replay.wait(240) == 0, replay.output
    assert "gflowdist: replay identical" in replay.output, replay.output
    replayed = Path(read_json(next((run / "replays").glob("*/replay.json")))["replayed"])
    assert _metrics(replayed) == _metrics(run) and _metrics(run)
    assert read_json(replayed / "ledger.json")["per_rank"] == read_json(run / "ledger.json")["per_rank"]
    assert recorded.no_process_left() and replay.no_process_left()
