"""What a trainer does with one learner batch: prepare, epochs x minibatches of optimizer steps, schedule.

    batch = trainer.prepare(batch)                       # once per batch (e.g. advantages)
    repeat learner.epochs times:
        shuffle the items; split them into learner.minibatches equal minibatches
        for each minibatch:
            loss(minibatch) -> backward -> average the gradients in my agent group
            -> clip to learner.max_grad_norm -> optimizer step
    trainer.scheduler.step()                             # once per trainer step, when set

With ``learner.target_kl`` the epochs end early at the first minibatch whose
KL (the loss's ``learner.kl_key`` value), averaged over the agent group, is
above 1.5 x target_kl (Spinning Up's and Stable-Baselines3's rule): that
minibatch's step and the rest are skipped by every member alike, and the
metric ``optimizer_steps`` says how many were taken.

With the defaults (1 epoch, 1 minibatch) this is the two-method common case:
one ``loss(batch)`` and one optimizer step per trainer step.

The report's phases: ``prepare`` once per trainer step (where the trainer's
class defines it); per optimizer step one
``loss`` (the loss, the KL check, backward), one ``sync`` (the group's
average) and one ``optimizer`` (clipping and the step).

:meth:`Trainer.loss <gflowdist.runtime.roles.Trainer.loss>` returns the scalar
loss, or a dict holding it under ``"loss"`` beside named numbers (policy loss,
entropy, KL, ...): :func:`read_loss` checks it and names the trainer's class
and method when it is neither. The step's values (each averaged over its
optimizer steps) become the trainer's metrics.

The trainers of an agent group average their gradients at every optimizer
step, so each must take as many as the others: with more than one step per
batch the group compares its counts once per trainer step
(:meth:`~gflowdist.runtime.loops.agent_group.AgentGroup.check_same_steps`) and
every member fails with the ranks' counts instead of waiting in an average
that a peer never joins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import torch

from gflowdist.config import LearnerConfig
from gflowdist.errors import GflowdistError
from gflowdist.runtime.faults import loss_is_usable
from gflowdist.runtime.loops.agent_group import AgentGroup
from gflowdist.runtime.roles import Trainer
from gflowdist.timing import StepTimer

__all__ = ["LearnerStep", "read_loss", "split_minibatches", "model_of", "optimizer_of"]


def model_of(trainer: Trainer) -> torch.nn.Module:
    """``trainer.model``, which the step needs now; a :class:`GflowdistError` naming the class when it is None."""
    if trainer.model is None:
        raise GflowdistError(_unset(trainer, "model"))
    return trainer.model


def optimizer_of(trainer: Trainer) -> torch.optim.Optimizer:
    """``trainer.optimizer``, which the step needs now; a :class:`GflowdistError` naming the class when it is None."""
    if trainer.optimizer is None:
        raise GflowdistError(_unset(trainer, "optimizer"))
    return trainer.optimizer


def _unset(trainer: Trainer, field: str) -> str:
    cls = type(trainer)
    return (
        f"roles.trainer: {cls.__module__}.{cls.__qualname__}.setup() left self.{field} None; a trainer sets "
        "self.model and self.optimizer in setup() (gflowdist.runtime.roles.Trainer)"
    )


def read_loss(result: Any, owner: str) -> tuple[torch.Tensor, dict[str, float]]:
    """``(scalar loss tensor, {name: float})`` from what ``owner`` (``"MyTrainer.loss()"``) returned.

    Accepted: a scalar tensor (one element), or a mapping with a scalar tensor under
    ``"loss"`` and numbers (int, float, one-element tensors) under other string keys.
    """
    aux: dict[str, float] = {}
    if isinstance(result, Mapping):
        if "loss" not in result:
            raise GflowdistError(
                f"{owner} returned a dict without 'loss' (keys {sorted(map(str, result))}): the scalar to "
                f"minimise goes under 'loss', the other keys are named numbers for the metrics"
            )
        for name, value in result.items():
            if name == "loss":
                continue
            if not isinstance(name, str):
                raise GflowdistError(f"{owner} returned an auxiliary value named {name!r}: names must be strings")
            aux[name] = _number(value, f"{owner} returned {name!r}")
        loss = result["loss"]
        what = f"{owner} returned 'loss' as"
    else:
        loss, what = result, f"{owner} returned"
    if not isinstance(loss, torch.Tensor):
        raise GflowdistError(
            f"{what} {type(loss).__name__}: expected a scalar tensor (or a dict with one under 'loss' "
            f"beside named numbers)"
        )
    if loss.numel() != 1:
        raise GflowdistError(
            f"{what} a tensor of shape {list(loss.shape)}: expected a scalar (reduce it, e.g. .mean())"
        )
    return loss.reshape(()), aux


def _number(value: Any, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise GflowdistError(f"{what} as a tensor of shape {list(value.shape)}: auxiliary values are numbers")
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise GflowdistError(
        f"{what} as {type(value).__name__} {value!r:.60}: auxiliary values are numbers (int, float or a "
        f"one-element tensor)"
    )


def split_minibatches(
    batch: dict[str, Any], count: int, generator: torch.Generator, owner: str
) -> list[dict[str, Any]]:
    """``batch``'s items shuffled and dealt into ``count`` equal minibatches (one, unshuffled, for ``count`` 1).

    Every tensor field must have the same leading (item) dimension, divisible by
    ``count``; values that are not tensors go to every minibatch as they are.
    """
    if count == 1:
        return [batch]
    sizes = {name: value.shape[0] for name, value in batch.items() if isinstance(value, torch.Tensor) and value.dim()}
    items = set(sizes.values())
    if len(items) != 1:
        raise GflowdistError(
            f"{owner} gave a batch whose fields have different leading sizes {sizes}: learner.minibatches "
            f"splits every field's items alike"
        )
    (n,) = items
    if n % count:
        raise GflowdistError(f"{owner} gave a batch of {n} items, which learner.minibatches {count} does not divide")
    order = torch.randperm(n, generator=generator).view(count, n // count)
    parts = []
    for index in order:
        part = {}
        for name, value in batch.items():
            part[name] = value[index.to(value.device)] if name in sizes else value
        parts.append(part)
    return parts


class LearnerStep:
    """One trainer step's learning, configured by the ``learner`` section (see the module docstring)."""

    def __init__(
        self,
        trainer: Trainer,
        group: AgentGroup,
        config: LearnerConfig,
        timer: StepTimer,
        *,
        rank: int,
        on_nonfinite: str,
        note_skip: Callable[[int], None],
    ):
        self.trainer, self.group, self.config, self.timer = trainer, group, config, timer
        self.rank, self.on_nonfinite, self.note_skip = rank, on_nonfinite, note_skip
        name = type(trainer).__name__
        self.loss_owner, self.prepare_owner = f"{name}.loss()", f"{name}.prepare()"
        # the minibatches' shuffle: its own stream, so the user's self.generator is left as it is
        self.shuffle = torch.Generator().manual_seed(trainer.generator.initial_seed() ^ 0x5EED_5EED)
        self.skipped = 0  # optimizer steps whose loss was not finite (faults.on_nonfinite_loss: skip)
        #: whether the trainer's class defines prepare() (the base's returns the batch: nothing to time)
        self.prepares = type(trainer).prepare is not Trainer.prepare

    def __call__(self, batch: dict[str, Any], step: int) -> dict[str, float]:
        """Learn from ``batch`` at trainer step ``step``; the step's ``loss`` and auxiliary values
        (each the mean over its optimizer steps), ``grad_norm`` when clipping, ``lr`` with a schedule."""
        trainer, config = self.trainer, self.config
        with self.timer.phase("prepare") if self.prepares else nullcontext():
            batch = trainer.prepare(batch)
            if not isinstance(batch, dict):
                raise GflowdistError(f"{self.prepare_owner} returned {type(batch).__name__}: expected the batch dict")
        if config.batch_size is not None:
            self._check_size(batch, step)
        if config.optimizer_steps > 1:
            self.group.check_same_steps(config.optimizer_steps)
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        taken = 0
        for _ in range(config.epochs):
            for minibatch in split_minibatches(batch, config.minibatches, self.shuffle, self.prepare_owner):
                stepped, minibatch_values = self._optimizer_step(minibatch, step)
                taken += stepped
                for name, value in minibatch_values.items():
                    totals[name] = totals.get(name, 0.0) + value
                    counts[name] = counts.get(name, 0) + 1
                if not stepped:
                    break
            else:
                continue
            break  # stopped early: target_kl
        values = {name: total / counts[name] for name, total in totals.items()}
        if config.target_kl is not None:
            values["optimizer_steps"] = float(taken)
        scheduler = trainer.scheduler
        if scheduler is not None:
            scheduler.step()
            values["lr"] = float(optimizer_of(trainer).param_groups[0]["lr"])
        return values

    def _optimizer_step(self, minibatch: dict[str, Any], step: int) -> tuple[bool, dict[str, float]]:
        """loss -> backward -> the group's average -> clip -> optimizer step; ``(whether it went on,
        this minibatch's values)``.

        With ``learner.target_kl`` the loss's KL value (``learner.kl_key``), averaged over the
        agent group, is read first: above 1.5 x target_kl no step is taken, on any member
        (:meth:`stops_on_kl`), and the caller ends this trainer step's epochs.

        A NaN or infinite loss is caught before ``backward()`` (``faults.on_nonfinite_loss``,
        :func:`~gflowdist.runtime.faults.loss_is_usable`): ``fail`` raises; ``skip`` gives zero
        gradients, which still join my group's average so the replicas stay alike, and skips my
        optimizer step when there is no average to join.
        """
        trainer, timer = self.trainer, self.timer
        with timer.phase("loss"):  # one block per optimizer step: the report's iterations of "loss"
            optimizer_of(trainer).zero_grad(set_to_none=True)
            loss, aux = read_loss(trainer.loss(minibatch), self.loss_owner)
            if self.stops_on_kl(aux):
                return False, {"loss": float(loss.detach()), **aux}
            usable = loss_is_usable(loss, mode=self.on_nonfinite, rank=self.rank, step=step)
            if usable:
                loss.backward()  # type: ignore[no-untyped-call]  # Tensor.backward is unannotated in torch 2.13
            else:
                self.skipped += 1
                self.note_skip(step)
                for param in model_of(trainer).parameters():
                    if param.requires_grad:
                        param.grad = torch.zeros_like(param)
        self.group.average_gradients(trainer.model)
        values = {"loss": float(loss.detach()), **aux}
        if usable or self.group.averages_gradients:
            with timer.phase("optimizer"):
                if self.config.max_grad_norm is not None:
                    norm = torch.nn.utils.clip_grad_norm_(model_of(trainer).parameters(), self.config.max_grad_norm)
                    values["grad_norm"] = float(norm)
                optimizer_of(trainer).step()
        elif self.config.max_grad_norm is not None:
            values["grad_norm"] = 0.0
        return True, values

    def stops_on_kl(self, aux: Mapping[str, float]) -> bool:
        """Whether the group's mean KL (``learner.kl_key`` of the loss) is above 1.5 x ``learner.target_kl``.

        Decided on the agent group's mean (:meth:`AgentGroup.group_mean`), the same number on
        every member, so all stop at the same minibatch and the gradient averages line up.
        """
        target, key = self.config.target_kl, self.config.kl_key
        if target is None:
            return False
        if key not in aux:
            raise GflowdistError(
                f"{self.loss_owner} returned no {key!r} (auxiliary values: {sorted(aux) or 'none'}): "
                f"learner.target_kl stops the epochs on it; return the minibatch's KL under {key!r} "
                f"or name it with learner.kl_key"
            )
        return self.group.group_mean(aux[key], "kl") > 1.5 * target

    def _check_size(self, batch: dict[str, Any], step: int) -> None:
        sizes = {value.shape[0] for value in batch.values() if isinstance(value, torch.Tensor) and value.dim()}
        expected = self.config.batch_size
        if sizes != {expected}:
            got = ", ".join(str(s) for s in sorted(sizes)) or "no tensor fields"
            raise GflowdistError(
                f"trainer rank {self.rank}'s learner batch at step {step} holds {got} items "
                f"({type(self.trainer).__name__}.rollout() and the replayed share, after "
                f"{self.prepare_owner}), but learner.batch_size is {expected}"
            )
