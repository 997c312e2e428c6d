"""A trainer and the other trainers of its agent group: one start, gradients or models averaged, one stop.

``sync.mode`` says how the group's replicas stay alike: ``gradients``
(averaged every step, before the optimizer step), ``models`` (weights
averaged every ``sync.every`` versions, after it) or ``none`` (each trainer
learns alone). A group of one has nothing to average.

The group stops at one step on every member (:meth:`AgentGroup.agree_to_stop`):
each votes whether to stop before the next step. In mode ``gradients`` the
vote rides in the step's first gradient average (the bucket's rider slot,
:func:`~gflowdist.ops.averaging.average_gradients`), so a step costs one
collective, not two; a vote that found no average to ride (the first step,
or a step whose epochs ended before any average) is a MAX all-reduce of its own.
In mode ``models`` each member posts its vote a step ahead
(:mod:`~gflowdist.runtime.loops.posted_votes`), so the trainers meet only
where they average their weights, not at every step.

Each collective of the group is timed on every member
(:meth:`StepTimer.collective <gflowdist.timing.StepTimer.collective>`): the stop
vote, the gradient and the model averages; the report names the member that
arrived last at each and how long the others waited on it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gflowdist.comm import Communicator
from gflowdist.comm.base import ReduceOp
from gflowdist.config import SyncConfig
from gflowdist.errors import GflowdistError
from gflowdist.runtime.loops.posted_votes import PostedVotes
from gflowdist.runtime.wiring import Wiring
from gflowdist.timing import StepTimer

__all__ = ["AgentGroup"]


class AgentGroup:
    """My agent group's communicator (None outside one), the ``sync`` config, and where averaging time goes."""

    def __init__(self, comm: Communicator | None, sync: SyncConfig, timer: StepTimer, *, steps: int | None = None):
        self.comm = comm
        self.sync = sync
        self.timer = timer
        self.shared = sync.mode != "none" and comm is not None and comm.size > 1
        self.members = tuple(comm.world_rank(r) for r in range(comm.size)) if comm is not None else ()
        #: whether every step's gradients are averaged over the group (mode ``gradients``)
        self.averages_gradients = self.shared and sync.mode == "gradients"
        #: the next vote, to ride in the next gradient average: ``(step it is about, how to see my stop)``
        self._vote: tuple[int, Callable[[int], bool]] | None = None
        #: a vote the last gradient average carried: ``(step, the group's decision, mine)``
        self._carried: tuple[int, bool, bool] | None = None
        #: the step the loop ends before (``run.steps``): no vote is posted about it; None: no end known
        self.steps = steps
        #: mode ``models``: the votes posted a step ahead
        self._posted = PostedVotes(comm) if self.shared and sync.mode == "models" and comm is not None else None

    def _averaged(self, model: torch.nn.Module | None) -> torch.nn.Module:
        """The model this shared group averages; a named error when the trainer set none."""
        if model is None:
            raise GflowdistError(
                f"roles.trainer: sync.mode is {self.sync.mode!r} in an agent group of {len(self.members)} trainers, "
                "which averages each trainer's self.model, but this trainer's is None: set self.model in setup()"
            )
        return model

    @property
    def group(self) -> Communicator:
        """The group's communicator, for what only a shared group does (:attr:`shared`)."""
        if self.comm is None:
            raise RuntimeError("this trainer is in no agent group: nothing to share")  # guarded by self.shared
        return self.comm

    def align(self, model: torch.nn.Module | None) -> None:
        """Start every replica from the same weights: those of the group's first trainer."""
        from gflowdist.ops.averaging import sync_params

        if self.shared:
            with self.timer.phase("sync"):
                sync_params(self._averaged(model), self.comm)

    def average_gradients(self, model: torch.nn.Module | None) -> None:
        """Average the gradients over the group (mode ``gradients``); the first of a step carries the stop vote."""
        from gflowdist.ops.averaging import average_gradients

        if not self.averages_gradients:
            return
        vote, self._vote = self._vote, None
        mine = vote[1](vote[0]) if vote is not None else False
        with self.timer.phase("sync"), self.timer.collective("gradients", self.members):
            mean = average_gradients(self._averaged(model), self.comm, rider=None if vote is None else float(mine))
        if vote is not None and mean is not None:  # None: no parameter needs a gradient, so the vote rode nothing
            self._carried = (vote[0], mean > 0, mine)

    def check_same_steps(self, count: int) -> None:
        """Fail on every member, naming each one's count, unless all take ``count`` optimizer steps now.

        Each optimizer step averages gradients (mode ``gradients``), so a member that took fewer
        would leave the others waiting in an average it never joins; one all-gather of the counts
        per trainer step turns that hang into an error on every member at once.
        """
        from gflowdist.errors import GflowdistError

        if not self.averages_gradients:
            return
        with self.timer.collective("step_count", self.members):
            counts = [int(c.reshape(-1)[0]) for c in self.group.all_gather(torch.tensor([count], dtype=torch.int64))]
        if len(set(counts)) > 1:
            listed = ", ".join(f"rank {rank}: {c}" for rank, c in zip(self.members, counts, strict=True))
            raise GflowdistError(
                f"the trainers of an agent group take different numbers of optimizer steps this trainer "
                f"step ({listed}): every step averages gradients, so each must take learner.epochs x "
                f"learner.minibatches"
            )

    def group_mean(self, value: float, name: str) -> float:
        """``value`` averaged over the members that average gradients (mine alone otherwise).

        One all-gather of a float64 per call: every member receives the same list in rank
        order and sums it in that order, so each gets the very same mean and a threshold on
        it decides alike everywhere (an early stop of the epochs, say), keeping the
        gradient averages lined up.
        """
        if not self.averages_gradients:
            return value
        with self.timer.collective(name, self.members):
            values = self.group.all_gather(torch.tensor([value], dtype=torch.float64))
        return sum(float(v.reshape(-1)[0]) for v in values) / len(values)

    def average_models(self, model: torch.nn.Module | None, version: int) -> None:
        """Average the weights over the group (mode ``models``, every ``sync.every`` versions)."""
        from gflowdist.ops.averaging import average_models

        if self.shared and self.sync.mode == "models" and version % self.sync.every == 0:
            with self.timer.phase("sync"), self.timer.collective("models", self.members):
                average_models(self._averaged(model), self.comm)

    def agree_to_stop(self, w: Wiring, step: int) -> bool:
        """Whether to stop before ``step``, agreed by the whole group.

        A signal reaches the trainers of a group at slightly different times (on
        other hosts, through hydra's proxies); a trainer that stopped alone would
        leave its peers waiting in the next average forever. So every member
        votes, and all stop at the same step when any voted to. The vote about
        ``step`` is taken in the previous step's first gradient average where
        there was one (mode ``gradients``: a stop seen later waits one step
        more), else here in a MAX all-reduce of its own. Every member takes the
        same path: they average alike. In mode ``models`` the votes are posted a
        step ahead (``_take_posted``).
        """
        if self._posted is not None:
            return self._take_posted(w, step, self._posted)
        carried, self._carried = self._carried, None
        if carried is not None and carried[0] == step:
            _, decided, mine = carried
        else:
            mine = w.choices.stop_seen(step)
            if not self.shared:
                return mine
            flag = torch.tensor([1.0 if mine else 0.0])
            with self.timer.collective("stop_vote", self.members):
                self.group.all_reduce(flag, op=ReduceOp.MAX)
            decided = flag.item() > 0
        if decided and not mine:
            w.stop.set("an agent-group peer stopped")
        if self.averages_gradients and not decided:
            self._vote = (step + 1, w.choices.stop_seen)
        return decided

    def _take_posted(self, w: Wiring, step: int, votes: PostedVotes) -> bool:
        """Mode ``models``: the group's votes about ``step`` (mine posted at the last step, or now at the
        first); then, going on, mine about the next step, posted (a stop seen later waits a step more)."""
        if votes.posted is None:  # the first step: nothing posted yet
            votes.post(step, w.choices.stop_seen(step))
        mine = votes.posted is not None and votes.posted[1]
        with self.timer.collective("stop_vote", self.members):
            decided = votes.take(step)
        if decided and not mine:
            w.stop.set("an agent-group peer stopped")
        if not decided and (self.steps is None or step + 1 < self.steps):
            votes.post(step + 1, w.choices.stop_seen(step + 1))
        return decided
