"""Checkpoints you can trust, in one process: checksums, fallback to the newest intact one, write errors.

The end-to-end versions (a real job resumed after the same damage, a full
disk under a running job) are in tests/test_resume_faults.py.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import torch

from gflowdist.comm.local import LocalComm
from gflowdist.errors import CheckpointError
from gflowdist.rundir import create_run_dir
from gflowdist.runtime import checkpoints
from gflowdist.runtime.resume import choose_checkpoint
from tests.support.corrupt import DAMAGES

OLDER, NEWER = checkpoints.checkpoint_name(0, 5), checkpoints.checkpoint_name(0)


def _payload(step: int) -> dict:
    generator = torch.Generator().manual_seed(step)
    return {"role": {"model": {"weight": torch.randn(256, generator=generator)}}, "runtime": {"step": step}}


def _checkpoint(run_dir, name: str, step: int) -> None:
    files = {0: checkpoints.save_rank(run_dir, name, 0, _payload(step))}
    checkpoints.write_manifest(run_dir, name, {"world_size": 1, "generation": 0, "complete": True}, files=files)


def test_an_intact_checkpoint_round_trips_and_its_manifest_holds_size_and_digest(tmp_path):
    _checkpoint(tmp_path, NEWER, 10)
    chosen = choose_checkpoint(tmp_path, LocalComm())
    assert chosen.name == NEWER and chosen.skipped == []
    assert torch.equal(chosen.payload["role"]["model"]["weight"], _payload(10)["role"]["model"]["weight"])
    entry = chosen.manifest["files"]["rank-00000.pt"]
    assert entry["bytes"] == (tmp_path / "checkpoints" / NEWER / "rank-00000.pt").stat().st_size
    assert len(entry["sha256"]) == 64
    assert not list((tmp_path / "checkpoints" / NEWER).glob("*.tmp"))


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_is_named_and_the_previous_intact_one_is_used(tmp_path, damage):
    _checkpoint(tmp_path, OLDER, 5)
    _checkpoint(tmp_path, NEWER, 10)
    victim = tmp_path / "checkpoints" / NEWER / "rank-00000.pt"
    word = DAMAGES[damage](victim)
    chosen = choose_checkpoint(tmp_path, LocalComm())
    assert chosen.name == OLDER and chosen.payload["runtime"]["step"] == 5
    [reason] = chosen.skipped
    named = victim.parent / "MANIFEST.json" if damage == "garbage_manifest" else victim
    assert f"checkpoint {NEWER} not used: {named}" in reason and word in reason, reason
    assert "weights_only=False" not in reason


def test_a_partial_checkpoint_is_named_and_the_newest_complete_one_is_used(tmp_path):
    _checkpoint(tmp_path, OLDER, 5)
    partial = tmp_path / "checkpoints" / NEWER
    checkpoints.save_rank(tmp_path, NEWER, 0, _payload(10))  # a save killed before its manifest
    chosen = choose_checkpoint(tmp_path, LocalComm())
    assert chosen.name == OLDER and chosen.step == 5
    assert chosen.skipped == [
        f"checkpoint {NEWER} not used: {partial}: no MANIFEST.json, a partial checkpoint (its save never finished)"
    ]
    assert checkpoints.candidates(tmp_path) == [OLDER]  # the complete ones
    assert checkpoints.checkpoint_names(tmp_path) == [NEWER, OLDER]


def test_a_file_without_a_checksum_that_torch_refuses_is_named_without_torchs_unsafe_advice(tmp_path):
    _checkpoint(tmp_path, NEWER, 10)
    manifest_path = tmp_path / "checkpoints" / NEWER / "MANIFEST.json"
    manifest = checkpoints.read_manifest(manifest_path.parent)
    del manifest["files"]  # a manifest of an older gflowdist: nothing to compare with
    manifest_path.write_text(__import__("json").dumps(manifest))
    victim = manifest_path.parent / "rank-00000.pt"
    # a pickle that names a class: what weights_only=True refuses, with advice to load it unsafely
    torch.save({"runtime": {}, "thing": LocalComm}, victim)
    with pytest.raises(CheckpointError) as caught:
        choose_checkpoint(tmp_path, LocalComm())
    text = str(caught.value)
    assert str(victim) in text and "not only tensors and plain values" in text
    assert "weights_only=False" not in text


def test_no_intact_checkpoint_lists_every_one_and_why(tmp_path):
    _checkpoint(tmp_path, OLDER, 5)
    _checkpoint(tmp_path, NEWER, 10)
    DAMAGES["truncated"](tmp_path / "checkpoints" / NEWER / "rank-00000.pt")
    (tmp_path / "checkpoints" / OLDER / "rank-00000.pt").unlink()
    with pytest.raises(CheckpointError) as caught:
        choose_checkpoint(tmp_path, LocalComm())
    text = str(caught.value)
    assert "no intact checkpoint" in text and f"{NEWER} not used" in text and "truncated" in text
    assert f"{OLDER} not used" in text and "missing" in text


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs at tmp_path/disk (root only), unmounted whatever happens."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk) -> None:
    """Take every free byte of ``disk``."""
    f = open(disk / "filler", "wb", buffering=0)
    try:
        while f.write(b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        f.close()


def test_a_full_disk_names_the_file_and_the_reason_and_the_previous_checkpoint_stays_newest(small_disk):
    _checkpoint(small_disk, OLDER, 5)
    _fill(small_disk)
    with pytest.raises(CheckpointError) as caught:
        checkpoints.save_rank(small_disk, NEWER, 0, _payload(10))
    text = str(caught.value)
    assert str(small_disk / "checkpoints" / NEWER / "rank-00000.pt") in text
    assert "No space left on device [ENOSPC]" in text and "inline_container" not in text
    assert not list((small_disk / "checkpoints" / NEWER).glob("*"))  # nothing half-written left behind
    assert checkpoints.latest_complete(small_disk)[0] == OLDER


def test_a_read_only_disk_names_the_directory_and_the_reason(small_disk):
    _checkpoint(small_disk, OLDER, 5)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with pytest.raises(CheckpointError) as caught:
        checkpoints.save_rank(small_disk, NEWER, 0, _payload(10))
    text = str(caught.value)
    assert str(small_disk / "checkpoints" / NEWER) in text and "Read-only file system [EROFS]" in text
    assert checkpoints.latest_complete(small_disk)[0] == OLDER


def test_two_run_directories_made_in_the_same_second_are_two(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda _format: "20260101-120000")
    first, second, third = (create_run_dir(tmp_path / "runs", "toy") for _ in range(3))
    assert [p.name for p in (first, second, third)] == [
        "toy-20260101-120000",
        "toy-20260101-120000-1",
        "toy-20260101-120000-2",
    ]
    assert all(p.is_dir() and not list(p.iterdir()) for p in (first, second, third))
    assert os.path.samefile(first.parent, tmp_path / "runs")
