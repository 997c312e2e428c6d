"""What a rank does about a fault it can see itself: a non-finite loss, a batch its buffer refused.

``faults.on_nonfinite_loss`` (``fail`` | ``skip``): :func:`loss_is_usable`
checks a trainer's loss before ``backward()``. ``fail`` raises
:class:`~gflowdist.errors.NonFiniteLossError` naming the rank and the step
(the run ends there, before the value reaches any weights); ``skip`` logs it
and the step goes on with zero gradients from this trainer: with
``sync.mode: gradients`` it still joins its agent group's average (so the
replicas stay identical), otherwise it skips its optimizer step.

``faults.on_bad_batch`` (``fail`` | ``drop``): a buffer that cannot store a
client's batch (its fields, per-item shapes or dtypes differ from what the
storage holds) refuses it, counts it against the sender (the ledger's
``refused`` per sender, and the batch's trajectories as dropped, reason
``bad_batch``), logs it and keeps serving the others. It tells the sender
(:func:`~gflowdist.runtime.protocol.refused`); :func:`on_refused` then raises
:class:`~gflowdist.errors.BadBatchError` with the buffer's words (``fail``)
or logs them and goes on (``drop``).

``faults.on_actor_loss: continue`` and ``replace`` need the MPI engine:
:func:`check_engine_allows` refuses them on a job that runs on torch
(``launch.engine: auto`` under a torch launcher; the config itself refuses
``launch.engine: torch`` and ``local``).
"""

from __future__ import annotations

import logging

import torch

from gflowdist.config import Config
from gflowdist.config.sections import ACTOR_LOSS_REFUSED
from gflowdist.engines import engine_named
from gflowdist.errors import BadBatchError, ConfigError, NonFiniteLossError

__all__ = ["loss_is_usable", "refusal_text", "on_refused", "check_engine_allows"]

log = logging.getLogger("gflowdist.runtime")


def loss_is_usable(loss: torch.Tensor, *, mode: str, rank: int, step: int) -> bool:
    """True for a finite loss; for NaN/inf: raise (``fail``) or log and return False (``skip``)."""
    if bool(torch.isfinite(loss.detach()).all()):
        return True
    value = float(loss.detach().float().reshape(-1)[0]) if loss.numel() else float("nan")
    what = f"rank {rank}: the loss is {value} at step {step}"
    if mode == "fail":
        raise NonFiniteLossError(f"{what} (faults.on_nonfinite_loss = fail; 'skip' would drop the step and go on)")
    log.warning("%s: step skipped, no gradient from this trainer (faults.on_nonfinite_loss = skip)", what)
    return False


def refusal_text(buffer: str, sender: str, n: int, seq: int, reason: str) -> str:
    """``buffer rank 2 (buffer on vm) refused a batch of 8 trajectories (seq 40-47) from rank 1 (...): <reason>``."""
    return f"{buffer} refused a batch of {n} trajectories (seq {seq}-{seq + n - 1}) from {sender}: {reason}"


def on_refused(text: str, *, mode: str, step: int | None = None, origin: str = "") -> None:
    """The sender's side of a refusal: raise :class:`BadBatchError` (``fail``) or log it (``drop``).

    ``step``: the trainer step that produced the batch (the failure is reported at that step); ``origin``:
    where the batch was made, appended (``"ToyTrainer.rollout made it at step 5"``).
    """
    origin = f"; {origin}" if origin else ""
    if mode == "fail":
        raise BadBatchError(f"{text} (faults.on_bad_batch = fail; 'drop' would count it and go on){origin}", step=step)
    log.warning("%s: dropped (faults.on_bad_batch = drop)%s", text, origin)


def check_engine_allows(config: Config, engine: str) -> None:
    """Refuse ``faults.on_actor_loss: continue`` or ``replace`` when the job runs on an ``engine`` that cannot go
    on without a rank or replace one (:meth:`gflowdist.engines.Engine.refuses_actor_loss`; see the module docs)."""
    policy = config.faults.on_actor_loss
    why = engine_named(engine).refuses_actor_loss(policy)
    if why:
        raise ConfigError(
            ACTOR_LOSS_REFUSED.format(policy=policy, engine=f"this job runs on the {engine} engine", why=why),
            key="faults.on_actor_loss",
            file=config.file,
        )
