"""``gflowdist replay RUN_DIR``: run a recorded run again, every rank making the choices it recorded, and compare.

``RUN_DIR`` is a run of ``gflowdist run CONFIG --record``. The replay runs its
``config.yaml`` (the same layout, rank count, engine and seed) with
``run.replay_of = RUN_DIR`` into ``RUN_DIR/replays/replay-<timestamp>/``;
every rank follows its ``record/rank-N.msgpack`` (:mod:`gflowdist.runtime.replaying`).
Then it compares the two runs:

- ``metrics.jsonl``: every row, in order, every field but ``time`` (the
  seconds since the start, which no replay can repeat);
- ``ledger.json``: every rank's ledger and the totals.

and writes ``replay.json`` into the replay's directory::

    {"recorded": RUN_DIR, "identical": true, "metrics_rows": 40, "ledger_ranks": 4, "differences": []}

Before it starts: a run directory without a complete recording is refused
(one line); a role file that changed since the recording (its SHA-256) is
named in a warning, and the replay goes ahead: it stops at the first
divergence, naming the rank, where it was, and the event.

Exit status: 0 identical; 1 the runs differ, or the replay failed; 2 not a
recorded run; 4 the replay stopped at a divergence (its line names it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gflowdist.errors import ConfigError, GflowdistError

__all__ = ["add_parser", "run", "check_recording", "compare_runs", "ReplayVerdict"]

REPLAY_FILE = "replay.json"
#: How the collector announces the run directory (runtime.job).
RUN_DIR_LINE = "gflowdist: run directory "
#: The metrics field a replay cannot reproduce: seconds since the start of the run.
CLOCK_FIELDS = ("time",)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gflowdist replay``."""
    parser = subparsers.add_parser(
        "replay",
        help="run a run recorded with --record again, making its recorded choices, and compare",
        description="Run a run recorded with `gflowdist run CONFIG --record` again, every rank making the "
        "choices it recorded, into RUN_DIR/replays/; then compare metrics.jsonl (every field but "
        "time) and the ledger with the recorded run's. Stops at the first divergence, naming the "
        "rank, the step and the event.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the directory of a run recorded with --record")
    parser.set_defaults(handler=run)


@dataclass
class ReplayVerdict:
    """How a replay compares with its recorded run."""

    recorded: str
    replayed: str
    metrics_rows: int = 0
    ledger_ranks: int = 0
    differences: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "replayed": self.replayed,
            "identical": self.identical,
            "metrics_rows": self.metrics_rows,
            "ledger_ranks": self.ledger_ranks,
            "differences": self.differences,
        }


def run(args: argparse.Namespace) -> int:
    source = Path(args.run_dir).resolve()
    config = check_recording(source)
    out = source / "replays"
    overrides = [
        "run.record=false",
        f"run.replay_of={json.dumps(str(source))}",
        f"run.out_dir={json.dumps(str(out))}",
        "run.name=replay",
    ]
    sys.stdout.write(f"gflowdist: replaying {source} ({config.launch.nprocs} ranks, {config.launch.engine})\n")
    sys.stdout.flush()
    code, made = _launch([sys.executable, "-m", "gflowdist", "run", str(source / "config.yaml"), *overrides])
    if code != 0 or made is None:
        sys.stderr.write(f"gflowdist replay: the replay of {source} did not finish (exit {code})\n")
        return code or 1
    verdict = compare_runs(source, made)
    (made / REPLAY_FILE).write_text(json.dumps(verdict.to_dict(), indent=1) + "\n")
    if verdict.identical:
        sys.stdout.write(
            f"gflowdist: replay identical: {verdict.metrics_rows} metrics rows (every field but "
            f"time) and the ledger of {verdict.ledger_ranks} ranks; {made}\n"
        )
        return 0
    sys.stdout.write(f"gflowdist: replay DIFFERS from {source}:\n" + "".join(f"  {d}\n" for d in verdict.differences))
    return 1


def _launch(cmd: list[str]) -> tuple[int, Path | None]:
    """Run ``gflowdist run`` (its output passed on); its exit status and the run directory it announced."""
    made = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        for line in proc.stdout or ():  # stdout=PIPE: always a pipe
            sys.stdout.write(line)
            if made is None and line.startswith(RUN_DIR_LINE):
                made = Path(line[len(RUN_DIR_LINE) :].strip())
    except KeyboardInterrupt:  # the launcher got the signal too: it stops the ranks
        return proc.wait(), made
    return proc.wait(), made


def check_recording(source: Path):
    """The recorded run's config; refuses a directory without a complete recording; warns of changed files."""
    from gflowdist.rundir import recorded_config
    from gflowdist.runtime.observing import replayed_settings, role_file_digests
    from gflowdist.runtime.tape import read_recording, recording_path

    try:
        config = recorded_config(source)
    except ConfigError as err:
        raise ConfigError(str(err.detail), key="RUN_DIR") from None
    if not config.run.record:
        raise ConfigError(f"{source} was not recorded: record a run with gflowdist run CONFIG --record", key="RUN_DIR")
    headers = []
    for rank in range(config.launch.nprocs):
        header, _, complete = read_recording(recording_path(source, rank))
        if not complete:
            raise GflowdistError(
                f"{recording_path(source, rank)} ends before its last event (the recorded run "
                f"did not finish): it cannot be replayed to its end"
            )
        headers.append(header)
    recorded, now = headers[0].get("files", {}), role_file_digests(config)
    for path in sorted(set(recorded) | set(now)):
        if recorded.get(path) != now.get(path):
            sys.stderr.write(
                f"gflowdist replay: warning: {path} changed since the recording (SHA-256): the "
                f"replay may diverge, and then stops at the first difference\n"
            )
    changed = _changed_settings(
        headers[0].get("config"), replayed_settings(config, config.launch.nprocs, config.launch.engine)
    )
    if changed:
        sys.stderr.write(
            f"gflowdist replay: warning: {source / 'config.yaml'} changed since the recording: "
            f"{'; '.join(changed)}: the replay may diverge, and then stops at the first difference\n"
        )
    return config


def _changed_settings(recorded: Any, now: dict[str, Any]) -> list[str]:
    """``"section.key: X recorded, Y now"`` for each setting that differs (nothing if the recording has none)."""
    if not isinstance(recorded, dict):
        return []
    changed = []
    for section in sorted(set(recorded) | set(now)):
        before, after = recorded.get(section) or {}, now.get(section) or {}
        for key in sorted(set(before) | set(after)):
            if before.get(key) != after.get(key):
                changed.append(f"{section}.{key}: {before.get(key)!r} recorded, {after.get(key)!r} now")
    return changed


def compare_runs(recorded: Path, replayed: Path) -> ReplayVerdict:
    """Compare metrics.jsonl (every field but time) and ledger.json of two run directories."""
    verdict = ReplayVerdict(str(recorded), str(replayed))
    rows = [_metrics(recorded), _metrics(replayed)]
    verdict.metrics_rows = len(rows[0])
    for index, (a, b) in enumerate(zip(*rows, strict=False)):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            what = ", ".join(f"{k} {a.get(k)!r} recorded, {b.get(k)!r} replayed" for k in keys)
            verdict.differences.append(
                f"metrics.jsonl row {index + 1} (rank {a.get('rank')}, step {a.get('step')}): {what}"
            )
            break
    if len(rows[0]) != len(rows[1]):
        verdict.differences.append(f"metrics.jsonl: {len(rows[0])} rows recorded, {len(rows[1])} replayed")
    ledgers = [_ledger(recorded), _ledger(replayed)]
    verdict.ledger_ranks = len(ledgers[0].get("per_rank", {}))
    for rank in sorted(set(ledgers[0].get("per_rank", {})) | set(ledgers[1].get("per_rank", {})), key=int):
        a, b = (ledger.get("per_rank", {}).get(rank) for ledger in ledgers)
        if a != b:
            verdict.differences.append(f"ledger.json rank {rank}: {a} recorded, {b} replayed")
    if ledgers[0].get("totals") != ledgers[1].get("totals"):
        verdict.differences.append(
            f"ledger.json totals: {ledgers[0].get('totals')} recorded, {ledgers[1].get('totals')} replayed"
        )
    return verdict


def _metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK_FIELDS} for line in lines if line.strip()]


def _ledger(run_dir: Path) -> dict:
    return json.loads((run_dir / "ledger.json").read_text())
