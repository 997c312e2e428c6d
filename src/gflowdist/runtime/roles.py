"""The roles users subclass. Write the methods; gflowdist runs the loops.

**Actor** — samples with the current policy::

    class MyActor(Actor):
        def setup(self):                       # build self.model here
            self.model = Policy(**self.params)
        def rollout(self, policy_version):     # -> dict of tensors, batch first
            return sample(self.model, n=16)

    loop: repeat { apply new weights if any arrived; batch = rollout(v);
                   isend batch to my buffer (never blocks the next rollout) }

    ``rollout`` may return None (nothing to send now, e.g. an actor pacing
    itself); ``initial_priorities(batch)`` may give each item's priority for a
    prioritized buffer; ``metrics()`` go to the collector every
    ``run.log_every`` rollouts.

**Trainer** — an actor that also learns::

    class MyTrainer(Trainer):
        def setup(self):
            self.model = Policy(**self.params)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        def rollout(self, policy_version): ...
        def loss(self, batch):                 # fresh + replayed trajectories
            return tb_loss(self.model, batch)

    loop, per step: fresh = rollout(v) -> isend fresh to my buffer ->
      take the replay batch prefetched last step and request the next one ->
      loss(fresh + replay) -> backward -> average gradients in my agent group
      -> optimizer step -> priorities(batch) back to my buffer -> v += 1
      -> weights to my actors

    A pure learner (Ape-X) returns None from ``rollout`` and learns from
    ``replay.learner_batch`` replayed items per step; with a prioritized
    buffer the batch holds ``weights`` and ``keys`` (see :meth:`Trainer.loss`).

    Beyond one loss and one optimizer step per step (PPO, A2C, IMPALA; see
    :class:`Trainer` and docs/rl.md): ``learner.epochs`` x ``learner.minibatches``
    optimizer steps per batch, ``learner.max_grad_norm`` clipping, a
    ``self.scheduler`` (torch lr_scheduler) stepped once per step,
    ``prepare(batch)`` once per batch (e.g. advantages), and ``loss`` returning
    ``{"loss": scalar, "entropy": ..., ...}`` to report named values.

**BufferManager** — owns a replay buffer, serves its clients::

    class MyBuffer(BufferManager):
        def score(self, batch):                # priority / keep-highest score
            return batch["log_rewards"]
        def on_admitted(self, batch):          # e.g. track discovered modes
            ...
        def summary(self):                     # sent to the coordinator
            return {"modes": len(self.modes)}

**Coordinator** — aggregates what trainers and buffers report::

    class MyCoordinator(Coordinator):
        def on_summary(self, rank, summary): ...
        def should_stop(self): return False    # end early (default: trainers finish)

Every role gets ``self.params`` (the config's ``params``, read-only: nested mappings too, lists as tuples),
``self.rank``, ``self.config``, ``self.generator`` (a torch.Generator
seeded from the run seed and the rank) and ``self.device`` (a
``torch.device``: ``cuda:<local rank>`` on a GPU node, else ``cpu``; see
``launch.devices``). Build models and tensors on ``self.device``; gflowdist
moves what crosses the wire through host memory and puts replayed batches on
the device of the fresh ones.

What a role must implement is abstract (``@abstractmethod``): ``rollout`` for
actors and trainers, ``loss`` for trainers. A class that leaves one out is
refused before the job starts (``gflowdist run`` checks the configured
classes), and by the job runner with the same message.

:class:`BaseRole` is the base class of the four; it is not the
:class:`~gflowdist.layout.Role` enum, which names a rank's role in the layout.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gflowdist.config.frozen import FrozenMapping
from gflowdist.errors import GflowdistError

if TYPE_CHECKING:
    from gflowdist.replay import ReplayBuffer

__all__ = ["BaseRole", "Actor", "Trainer", "BufferManager", "Coordinator"]


class BaseRole(abc.ABC):
    """What every role has: identity, parameters and a seeded generator."""

    def __init__(
        self,
        *,
        rank: int,
        config: Any,
        generator: torch.Generator,
        context: Any = None,
        device: str | torch.device = "cpu",
    ):
        self.rank = rank
        self.config = config
        self.device = torch.device(device)
        self.params: Mapping[str, Any] = config.params if config is not None else FrozenMapping()
        self.generator = generator
        self.context = context

    def setup(self) -> None:
        """Build models, optimizers, environments. Called once before the loop."""

    def summary(self) -> dict[str, Any]:
        """Plain values (numbers, strings, lists) sent to the coordinator now and then."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this role (tensors and plain values)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


class Actor(BaseRole):
    """Samples trajectories with ``self.model`` (see the module docstring)."""

    model: torch.nn.Module | None = None
    #: Set by the actor loop when my policy runs on an inference rank (``layout.inference``): a
    #: :class:`~gflowdist.runtime.remote_policy.RemotePolicy` that returns what ``act`` would; None otherwise.
    remote: Any = None
    #: What one item of a batch is, in the progress line's rate and the final line: ``trajectories``,
    #: ``transitions`` (:class:`~gflowdist.rl.EnvironmentActor`), ``unrolls``... (the producing class's).
    unit: ClassVar[str] = "trajectories"
    #: The setting that paces actors of this class, named when they flood the learners.
    pace_setting: ClassVar[str] = "replay.samples_per_insert (the rate limiter), or rollout() returning None"

    @abc.abstractmethod
    def rollout(self, policy_version: int) -> dict[str, torch.Tensor] | None:
        """Sample a batch of trajectories (a dict of tensors with the batch dimension first).

        None: nothing to send this time (a pure learner, an actor pacing itself);
        the loop goes on receiving weights and control messages and asks again.
        """

    def initial_priorities(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Priorities (finite, ``>= 0``, one per item) my buffer admits ``batch`` with when
        ``replay.sampler`` is ``prioritized`` (Ape-X actors send their TD errors); default None:
        the largest priority the buffer has seen."""
        return None

    def metrics(self) -> dict[str, float]:
        """Numbers for the progress line and metrics.jsonl (default: none): a trainer's every
        ``run.log_every`` steps, an actor's every ``run.log_every`` rollouts. The progress line
        averages a float over the ranks that report it and adds up an int (a count)."""
        return {}

    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Apply weights sent by my trainer (default: ``self.model.load_state_dict``)."""
        if self.model is not None:
            self.model.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict()} if self.model is not None else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.model is not None and "model" in state:
            self.model.load_state_dict(state["model"])


class Trainer(Actor):
    """Samples and learns; set ``self.model`` and ``self.optimizer`` in :meth:`setup`.

    One trainer step, as the runtime runs it (``gflowdist.runtime.loops.learner_step``)::

        batch = prepare(rollout(v) + replayed)        # prepare: once per batch, default as is
        repeat learner.epochs times:                   # default 1
            for each of learner.minibatches shuffled, equal parts of batch:   # default 1: the batch
                loss(part) -> backward -> gradients averaged in my agent group (sync.mode gradients)
                -> clipped to global norm learner.max_grad_norm (if set) -> optimizer.step()
        scheduler.step()                               # if self.scheduler is set
        v += 1 -> weights to my actors

    - **Minibatches** need ``learner.batch_size`` (items per batch, which they must divide;
      checked before launch). The trainers of an agent group all take
      ``epochs x minibatches`` optimizer steps per trainer step, each averaging the group's
      gradients (DD-PPO); a group whose members disagree fails naming each rank's count.
    - **KL early stop** (PPO's ``target_kl``): with ``learner.target_kl`` the epochs end at the
      first minibatch whose KL (the loss's named value ``learner.kl_key``, default
      ``approx_kl``), averaged over the agent group, exceeds 1.5 x target_kl; every member
      stops at that minibatch, its step not taken; the metric ``optimizer_steps`` counts the rest.
    - **Learning-rate schedule**: set ``self.scheduler`` to a ``torch.optim.lr_scheduler``
      of ``self.optimizer`` in :meth:`setup`; the runtime steps it once per trainer step
      (after the batch's optimizer steps), saves it in checkpoints and reports ``lr``.
    - **Named values**: :meth:`loss` may return ``{"loss": scalar, "policy_loss": ...,
      "entropy": ..., "approx_kl": ...}``; each value, averaged over the step's optimizer
      steps, reaches the progress line, metrics.jsonl, TensorBoard and the report (as does
      ``grad_norm``, the norm before clipping, when ``learner.max_grad_norm`` is set).
    """

    optimizer: torch.optim.Optimizer | None = None
    #: a ``torch.optim.lr_scheduler`` of :attr:`optimizer`, stepped once per trainer step; None = constant
    scheduler: Any = None

    @abc.abstractmethod
    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | Mapping[str, Any]:
        """The scalar loss of a batch (fresh and replayed trajectories concatenated), or of one
        minibatch of it (``learner.minibatches``).

        Return the scalar tensor, or a dict holding it under ``"loss"`` beside named numbers
        (floats, ints or one-element tensors: ``{"loss": total, "policy_loss": pl.detach(),
        "entropy": ent.detach()}``) for the metrics. Anything else (a tensor of more than one
        element, a value that is not a number) fails the run naming this class and method.

        With ``replay.sampler: prioritized`` the batch also holds ``weights``
        (importance weights; 1 for fresh items) and ``keys`` (-1 for fresh items).
        """

    def prepare(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Called once per learner batch, before its epochs and minibatches; returns the batch to
        learn from (default: ``batch`` as it is). E.g. compute advantages and value targets with
        the current value function (PPO from actors' unrolls), or flatten ``[E, T]`` unrolls into
        items. Runs without ``torch.no_grad``: wrap what should not be differentiated."""
        return batch

    def priorities(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """New priorities, one per item of the batch just learned from (e.g. ``|TD error|`` kept
        by :meth:`loss`), called after the optimizer step; the replayed items' values go back to
        my buffer without waiting. Default None: priorities stay as they are."""
        return None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])


class BufferManager(BaseRole):
    """Owns a :class:`~gflowdist.replay.ReplayBuffer` built from the ``replay`` config."""

    def make_buffer(self) -> ReplayBuffer:
        """The replay buffer (default: :meth:`ReplayBuffer.from_config` of the replay section)."""
        from gflowdist.replay import ReplayBuffer

        return ReplayBuffer.from_config(self.config.replay, generator=self.generator)

    def score(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """Per-trajectory scores (priority / keep-highest); default: ``log_rewards`` if present."""
        return batch.get("log_rewards")

    def on_admitted(self, batch: dict[str, torch.Tensor]) -> None:
        """Called with the trajectories just admitted (e.g. to track discovered modes)."""


class Coordinator(BaseRole):
    """Aggregates reports; decides when the run ends."""

    #: where :meth:`record` writes; the runtime sets it on the coordinator's rank
    metrics_sink: Callable[[int, dict[str, float]], None] | None = None

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        """Add my own row to ``metrics.jsonl`` at ``step`` (e.g. an evaluation of the weights of
        :meth:`on_weights`): the report's curves and TensorBoard show it beside the trainers' metrics."""
        if self.metrics_sink is None:
            raise GflowdistError(
                f"{type(self).__name__}.record() writes metrics.jsonl of a running job; "
                f"this coordinator is not part of one"
            )
        self.metrics_sink(int(step), {str(k): float(v) for k, v in metrics.items()})

    def on_metrics(self, rank: int, step: int, metrics: Mapping[str, float]) -> None:
        """A trainer's metrics at ``step``, or an actor's (``step``: the policy version it acts with)."""

    def on_summary(self, rank: int, summary: Mapping[str, Any]) -> None:
        """A role's :meth:`BaseRole.summary` (buffers report what they track)."""

    def progress_fields(self) -> dict[str, Any]:
        """Extra fields for the progress line (e.g. ``{"modes": "4/4"}``)."""
        return {}

    def on_weights(self, rank: int, state: Mapping[str, torch.Tensor], version: int) -> None:
        """The first trainer's weights at ``version``, every ``sync.weights_to_coordinator_every``
        steps (e.g. to evaluate the greedy policy)."""

    def should_stop(self) -> bool | str:
        """End the run now (default: never; the run ends when every trainer finished ``run.steps``).

        Return a string to say why: the run's last line shows it (``done (eval_return 500 >= 475)``);
        ``True`` stops it with the reason ``<Class>.should_stop()``."""
        return False
