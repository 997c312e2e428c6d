"""Resume as a new user does it, after the faults the issue lists, through the real CLI under mpiexec.

One launch pair does the work of several tests (the suite's time is dear):

1. two jobs start at once with the same ``run.out_dir`` in a project folder
   (``toy.yaml`` and ``toy_roles.py`` side by side, the config named
   relatively, ``-n 3`` rather than the config's 4 ranks: trainer 0,
   buffer 1, coordinator 2),
   while every ``toy-<timestamp>`` name of the next minutes is taken already:
   each gets a directory of its own;
2. run A: its four newest checkpoints damaged four ways (a truncated trainer
   file, random bytes in the buffer's file, a garbage manifest, NaNs written
   into a trainer's weights), a partial one between them (a save killed
   before its manifest) and resumed with ``--resume RUN_DIR`` alone from
   an empty folder elsewhere: every damaged checkpoint is named with its file
   and what is wrong, the partial one as partial, the run continues from the
   newest intact one, each
   ``(rank, step)`` once in metrics.jsonl, the ledger balanced;
3. run B, at the same time: its checkpoints directory on a full tmpfs, resumed
   from the repository root: the next checkpoint write fails naming the file
   and "No space left on device", and the previous checkpoint stays the
   newest complete one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from gflowdist.runtime.checkpoints import candidates, checkpoint_name, latest_complete
from tests.support.corrupt import garbage_manifest, nan_into_a_tensor, random_bytes, truncate
from tests.support.jobs import TOY, read_json
from tests.support.launching import REPO

LAYOUT = ("-n", "3", "faults.checkpoint_every=2")  # trainer 0, buffer 1, coordinator 2
STEPS = 10


def _metrics_keys(run: Path) -> list[tuple[int, int]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(row["rank"], row["step"]) for row in rows]


def _taken_names(out_dir: Path, minutes: int = 5) -> set[str]:
    """Empty ``toy-<timestamp>`` directories for every second of the next minutes: as if other jobs had them."""
    out_dir.mkdir(parents=True)
    now = time.time()
    names = {time.strftime("toy-%Y%m%d-%H%M%S", time.localtime(now + s)) for s in range(-2, 60 * minutes)}
    for name in names:
        (out_dir / name).mkdir()
    return names


def _damage(run: Path) -> dict[str, tuple[Path, str]]:
    """The four newest checkpoints of ``run``, each damaged one way, and a partial one between them:
    name -> (path to be named, word)."""
    final, step8, step6, step4 = (checkpoint_name(0, s) if s else checkpoint_name(0) for s in (None, 8, 6, 4))
    where = run / "checkpoints"
    victims = {
        final: (where / final / "rank-00000.pt", truncate),
        step8: (where / step8 / "rank-00001.pt", random_bytes),
        step6: (where / step6 / "MANIFEST.json", garbage_manifest),
        step4: (where / step4 / "rank-00000.pt", nan_into_a_tensor),
    }
    out = {}
    for name, (path, damage) in victims.items():
        word = damage(path if damage is not garbage_manifest else where / name / "rank-00000.pt")
        out[name] = (path, word)
    partial = checkpoint_name(0, 7)  # a save killed before its manifest: one rank's file, no MANIFEST.json
    (where / partial).mkdir()
    shutil.copy(where / step8 / "rank-00000.pt", where / partial / "rank-00000.pt")
    out[partial] = (where / partial, "no MANIFEST.json, a partial checkpoint")
    return out


class FullDisk:
    """``run/checkpoints`` moved onto a tmpfs just big enough for what it holds, then filled up."""

    def __init__(self, run: Path):
        self.where = run / "checkpoints"
        held = sum(p.stat().st_size for p in self.where.rglob("*") if p.is_file())
        saved = run.parent / "checkpoints.saved"
        shutil.move(self.where, saved)
        self.where.mkdir()
        size = held + 512 * 1024
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.where)], capture_output=True, text=True
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        for item in saved.iterdir():
            shutil.copytree(item, self.where / item.name)
        filler = open(self.where / "filler", "wb", buffering=0)
        try:
            while filler.write(b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            filler.close()

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], check=False)


def test_two_jobs_one_out_dir_then_resume_after_damage_and_on_a_full_disk(job_factory, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(TOY, project / "toy.yaml")
    shutil.copy(TOY.parent / "toy_roles.py", project / "toy_roles.py")
    taken = _taken_names(project / "runs")
    first = job_factory(f"run.steps={STEPS}", *LAYOUT, config="toy.yaml", folder=project, log="a.log")
    second = job_factory(f"run.steps={STEPS}", *LAYOUT, config="toy.yaml", folder=project, log="b.log")
    assert first.wait(180) == 0, first.output
    assert second.wait(180) == 0, second.output
    runs = sorted(p for p in (project / "runs").iterdir() if p.name not in taken)
    assert len(runs) == 2, runs  # two jobs, two new directories; the taken ones untouched
    assert all(not any((project / "runs" / name).iterdir()) for name in taken)
    for run in runs:
        assert read_json(run / "ledger.json")["balanced"]
        keys = _metrics_keys(run)
        assert len(keys) == len(set(keys)) and {r for r, _ in keys} == {0}, keys  # its own rows only
        assert len(list((run / "logs").glob("rank-*.log"))) == 3
    run_a, run_b = runs
    damaged = _damage(run_a)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    disk = FullDisk(run_b)
    try:
        resumed = job_factory("--resume", str(run_a), f"run.steps={STEPS + 4}", config=None, cwd=elsewhere)
        full = job_factory("--resume", str(run_b), f"run.steps={STEPS + 4}", config=None, cwd=REPO)
        code_a, code_b = resumed.wait(180), full.wait(180)
        after_b = latest_complete(run_b)
        left = sorted(p.name for p in disk.where.rglob("*.tmp"))
    finally:
        disk.unmount()

    out = resumed.output
    assert code_a == 0, out
    for name, (path, word) in damaged.items():
        line = next((item for item in out.splitlines() if f"checkpoint {name} not used:" in item), None)
        assert line is not None and str(path) in line and word in line, (name, out)
    assert f"resuming from checkpoint {checkpoint_name(0, 2)} (the newest complete, intact one)" in out, out
    assert "weights_only=False" not in out
    finals = read_json(run_a / "finals.json")
    assert finals["0"]["step"] == STEPS + 4 and len(finals) == 3  # the run's 3 ranks, without -n
    assert read_json(run_a / "ledger.json")["balanced"]
    keys = _metrics_keys(run_a)
    assert len(keys) == len(set(keys)) and max(step for _, step in keys) == STEPS + 3, keys
    assert candidates(run_a)[0] == checkpoint_name(1)  # the resumed run's own final checkpoint

    out = full.output
    assert code_b not in (0, 2), out
    failed = re.search(
        r"cannot write checkpoint file (\S+/checkpoints/gen-0001-step-000000012/rank-\d{5}\.pt): "
        r"No space left on device \[ENOSPC\]",
        out,
    )
    assert failed and failed[1].startswith(str(run_b)), out
    assert "inline_container" not in out
    assert after_b is not None and after_b[0] == checkpoint_name(0), after_b  # still the newest complete one
    assert left == [], left
    assert resumed.no_process_left() and full.no_process_left()
