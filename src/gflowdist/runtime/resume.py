"""Which checkpoint a resumed run starts from: the newest complete one that every rank can read intact.

Every rank checks its own file of a candidate (present, size and SHA-256 as
the manifest says, loadable with ``weights_only=True``); the ranks exchange
their verdicts, so all of them take the same checkpoint. A candidate any rank
finds damaged, and a partial one (no manifest: its save never finished), is
skipped, and the reason (the file and what is wrong) is kept for the
collector to print::

    gflowdist: checkpoint gen-0000-final not used: .../gen-0000-final: no MANIFEST.json, a partial checkpoint (...)
    gflowdist: checkpoint gen-0000-step-000000010 not used: .../rank-00000.pt: truncated: 812 bytes, the manifest says 1546
    gflowdist: resuming from checkpoint gen-0000-step-000000005 (the newest complete, intact one)

``gflowdist run --resume`` makes the checks that need no torch before it
launches the ranks (``gflowdist.rundir.newest_intact``), so a run
directory without an intact checkpoint is refused there, in one line; these
checks on the ranks stay for jobs started by another launcher.

No intact checkpoint at all is a :class:`~gflowdist.errors.CheckpointError`
listing every candidate and why it was refused. :func:`restore` loads the
chosen one into a rank's role, run state, RNGs and replay buffer.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gflowdist.errors import CheckpointError, GflowdistError
from gflowdist.runtime import checkpoints
from gflowdist.runtime.ledger import Ledger

if TYPE_CHECKING:
    from gflowdist.comm import Communicator
    from gflowdist.replay import ReplayBuffer
    from gflowdist.runtime.roles import BaseRole
    from gflowdist.runtime.state import RunState

__all__ = ["Chosen", "choose_checkpoint", "Restored", "restore"]

log = logging.getLogger("gflowdist.runtime")


@dataclass
class Chosen:
    """The checkpoint to resume from, this rank's part of it, and what was skipped on the way."""

    name: str
    manifest: dict[str, Any]
    payload: dict[str, Any]
    skipped: list[str] = field(default_factory=list)  # "checkpoint X not used: <file>: <what is wrong>"

    @property
    def step(self) -> int | None:
        """The step the run continues from: the manifest's (``gflowdist.rundir.checkpoint_step``)."""
        return checkpoints.checkpoint_step(self.name, self.manifest)


def choose_checkpoint(run_dir: Path, world: Communicator) -> Chosen:
    """Collective over ``world``: the newest complete checkpoint of ``run_dir`` intact on every rank."""
    names = json.loads(world.all_gather_bytes(json.dumps(checkpoints.checkpoint_names(run_dir)).encode())[0])
    if not names:
        raise CheckpointError(
            f"--resume {run_dir}: no checkpoint in {Path(run_dir) / 'checkpoints'}",
            path=str(Path(run_dir) / "checkpoints"),
        )
    skipped: list[str] = []
    for name in names:
        manifest, payload, problem = _check_mine(run_dir, name, world)
        problems = [p.decode() for p in world.all_gather_bytes(problem.encode())]
        bad = list(dict.fromkeys(p for p in problems if p))  # a bad manifest is seen by every rank: once
        if not bad:
            return Chosen(name, manifest, payload, skipped)
        skipped.append(f"checkpoint {name} not used: {'; '.join(bad)}")
    raise CheckpointError(
        f"--resume {run_dir}: no intact checkpoint: " + "; ".join(skipped), path=str(Path(run_dir) / "checkpoints")
    )


def _check_mine(run_dir: Path, name: str, world: Communicator) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``(manifest, my payload, "")``, or ``({}, {}, what is wrong)``."""
    try:
        manifest = checkpoints.read_manifest(checkpoints.checkpoint_dir(run_dir, name))
        if manifest["world_size"] != world.size:
            raise GflowdistError(
                f"--resume {run_dir}: checkpoint {name} was written by {manifest['world_size']} "
                f"ranks, this job has {world.size} (resume with -n {manifest['world_size']})"
            )
        return manifest, checkpoints.load_rank(run_dir, name, world.rank, manifest), ""
    except CheckpointError as err:
        return {}, {}, str(err)


@dataclass
class Restored:
    """What a resumed rank continues from: the checkpoint, its ledger, this run's generation, what was skipped."""

    name: str
    step: int | None  # the step it continues from (the checkpoint's manifest), None if unknown
    ledger: Ledger
    generation: int
    skipped: list[str]


def restore(
    run_dir: Path,
    world: Communicator,
    role: BaseRole,
    state: RunState,
    generator: torch.Generator,
    replay: ReplayBuffer | None = None,
) -> Restored:
    """Collective: load this rank's part of the checkpoint :func:`choose_checkpoint` picks into these objects."""
    chosen = choose_checkpoint(run_dir, world)
    saved = chosen.payload
    if saved.get("lost"):  # the run went on without me: my slot holds my counts, no role state
        log.warning(
            "checkpoint %s has no state of mine (%s): I start from setup(), my counts carried on",
            chosen.name,
            saved["lost"],
        )
    else:
        role.load_state_dict(saved["role"])
        torch.set_rng_state(saved["torch_rng"])
        generator.set_state(saved["generator"])
    state.load(saved["runtime"])
    if replay is not None and "replay" in saved:
        replay.load_state_dict(saved["replay"])
    for reason in chosen.skipped:
        log.warning("%s", reason)
    log.info("resumed from checkpoint %s at step %s", chosen.name, getattr(state, "step", 0))
    ledger = Ledger.from_dict(saved["ledger"])
    earlier = chosen.manifest.get("replaced", {}).get(str(world.rank))
    if earlier:  # faults.on_actor_loss: replace: my rank's lost processes' counts, which my buffer received too
        lost = Ledger.from_dict(earlier)
        ledger.produced += lost.produced
        ledger.sent += lost.sent
        ledger.dropped.update(lost.dropped)
    return Restored(chosen.name, chosen.step, ledger, chosen.manifest["generation"] + 1, chosen.skipped)
