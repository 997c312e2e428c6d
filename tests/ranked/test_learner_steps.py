"""The learner step across an agent group: per-minibatch averages, clipping after them, the step count.

Every rank learns from its own data; the group's replicas must stay equal and
match one process learning from all the ranks' data (equal shares: the mean of
the ranks' mean losses is the mean over everything). A member that takes
another number of optimizer steps fails every member, naming the ranks.
"""

from __future__ import annotations

import pytest
import torch

from gflowdist.config import LearnerConfig, SyncConfig
from gflowdist.errors import GflowdistError
from gflowdist.runtime import Trainer
from gflowdist.runtime.loops.agent_group import AgentGroup
from gflowdist.runtime.loops.learner_step import LearnerStep
from gflowdist.timing import StepTimer

W = torch.tensor([1.0, -2.0, 0.5])
ITEMS = 8


def data(rank: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(ITEMS, 3, generator=g)
    return {"x": x, "y": x @ W + rank}


class Line(Trainer):
    def setup(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def rollout(self, policy_version):
        return None

    def loss(self, batch):
        return {"loss": ((self.model(batch["x"]).squeeze(-1) - batch["y"]) ** 2).mean(), "items": len(batch["x"])}


def make(comm, **learner):
    trainer = Line(rank=comm.rank, config=None, generator=torch.Generator().manual_seed(comm.rank))
    trainer.setup()
    group = AgentGroup(comm, SyncConfig(mode="gradients"), StepTimer())
    step = LearnerStep(
        trainer, group, LearnerConfig(**learner), StepTimer(), rank=comm.rank, on_nonfinite="fail", note_skip=print
    )
    return trainer, step


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("clip", [None, 0.05])
def test_epochs_of_averaged_steps_match_one_process_on_all_the_data(comm, clip):
    trainer, step = make(comm, epochs=3, max_grad_norm=clip)
    step(data(comm.rank), step=0)
    mine = flat(trainer.model)
    assert all(torch.equal(other, mine) for other in comm.all_gather(mine))  # the replicas stay alike
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    everything = [data(r) for r in range(comm.size)]
    x, y = torch.cat([d["x"] for d in everything]), torch.cat([d["y"] for d in everything])
    for _ in range(3):
        optimizer.zero_grad()
        ((reference(x).squeeze(-1) - y) ** 2).mean().backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)  # the global norm of the average
        optimizer.step()
    torch.testing.assert_close(mine, flat(reference))


def test_minibatches_keep_the_replicas_alike(comm):
    trainer, step = make(comm, epochs=2, minibatches=4, batch_size=ITEMS, max_grad_norm=1.0)
    for s in range(3):
        values = step(data(comm.rank), step=s)
    assert values["items"] == ITEMS / 4
    mine = flat(trainer.model)
    assert all(torch.equal(other, mine) for other in comm.all_gather(mine))


def test_a_member_taking_another_step_count_fails_every_member(comm):
    group = AgentGroup(comm, SyncConfig(mode="gradients"), StepTimer())
    group.check_same_steps(6)  # all agree: nothing happens
    if comm.size == 1:
        return
    members = ", ".join(f"rank {r}: {6 if r else 3}" for r in range(comm.size))
    with pytest.raises(GflowdistError, match=f"different numbers of optimizer steps this trainer step \\({members}\\)"):
        group.check_same_steps(6 if comm.rank else 3)


class Drifting(Line):
    """Reports a KL that grows by ``0.01 x (rank + 1)`` at every loss call: alone, each rank would stop elsewhere."""

    def setup(self):
        super().setup()
        self.calls = 0

    def loss(self, batch):
        self.calls += 1
        return {**super().loss(batch), "approx_kl": 0.01 * (self.rank + 1) * self.calls}


def test_target_kl_stops_every_member_at_the_same_minibatch_on_the_groups_mean_kl(comm):
    target = 0.021  # stop above 0.0315 (no mean below lands on it)
    trainer = Drifting(rank=comm.rank, config=None, generator=torch.Generator().manual_seed(comm.rank))
    trainer.setup()
    group = AgentGroup(comm, SyncConfig(mode="gradients"), StepTimer())
    config = LearnerConfig(epochs=3, minibatches=4, batch_size=ITEMS, target_kl=target)
    step = LearnerStep(trainer, group, config, StepTimer(), rank=comm.rank, on_nonfinite="fail", note_skip=print)
    values = step(data(comm.rank), step=0)
    # the group's mean KL at call k is 0.01 k (size + 1) / 2: the first k above 0.0315 is evaluated, not stepped
    mean_per_call = 0.01 * (comm.size + 1) / 2
    first_over = next(k for k in range(1, 13) if mean_per_call * k > 1.5 * target)
    assert trainer.calls == first_over
    assert values["optimizer_steps"] == first_over - 1
    alone = next(k for k in range(1, 13) if 0.01 * (comm.rank + 1) * k > 1.5 * target)
    if comm.size > 1 and comm.rank == 0:
        assert alone > first_over  # deciding on its own KL, this member would have stopped elsewhere
    taken = comm.all_gather(torch.tensor([values["optimizer_steps"]], dtype=torch.float64))
    assert {float(t.reshape(-1)[0]) for t in taken} == {first_over - 1.0}
    mine = flat(trainer.model)
    assert all(torch.equal(other, mine) for other in comm.all_gather(mine))  # the averages lined up
    values = step(data(comm.rank), step=1)  # the next trainer step starts its epochs anew, still aligned
    assert all(torch.equal(other, flat(trainer.model)) for other in comm.all_gather(flat(trainer.model)))


class StopFlag:
    """The stop flag of a rank's wiring, as :meth:`AgentGroup.agree_to_stop` uses it."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason


class Wired:
    """What ``agree_to_stop`` reads of a rank's wiring: the choices (who sees a stop, before which step) and the flag."""

    def __init__(self, sees_stop_from: int | None):
        self.stop = StopFlag()
        self.choices = self
        self.sees_stop_from = sees_stop_from
        self.asked: list[int] = []

    def stop_seen(self, point: int) -> bool:
        self.asked.append(point)
        seen = self.sees_stop_from is not None and point >= self.sees_stop_from
        if seen:
            self.stop.set("a signal")
        return seen


def counts(timer: StepTimer) -> dict[str, int]:
    return {name: len(durations) for (name, _group), durations in timer.collectives.items()}


@pytest.mark.parametrize("target_kl", [None, 0.001])
def test_the_group_stops_together_at_the_step_after_any_member_saw_a_stop(comm, target_kl):
    """The last member sees a stop before step 3: every member stops there. The vote rides in the step's
    gradient average, so each step costs one collective; where the epochs end before any average
    (target_kl far below the KL), each vote is an all-reduce of its own."""
    trainer = Drifting(rank=comm.rank, config=None, generator=torch.Generator().manual_seed(comm.rank))
    trainer.setup()
    timer = StepTimer()
    group = AgentGroup(comm, SyncConfig(mode="gradients"), timer)
    step = LearnerStep(
        trainer,
        group,
        LearnerConfig(target_kl=target_kl),
        timer,
        rank=comm.rank,
        on_nonfinite="fail",
        note_skip=print,
    )
    wired = Wired(3 if comm.rank == comm.size - 1 else None)
    s = 0
    while s < 10 and not group.agree_to_stop(wired, s):  # type: ignore[arg-type]  # the wiring's two parts it reads
        step(data(comm.rank), step=s)
        s += 1
    assert s == 3
    assert wired.asked == [0, 1, 2, 3]  # each vote asked once, about the step it decides
    if comm.rank == comm.size - 1:
        assert wired.stop.reason == "a signal"
    else:
        assert wired.stop.reason == "an agent-group peer stopped"
    if comm.size == 1:
        assert counts(timer) == {}  # a group of one has no one to vote with
    elif target_kl is None:
        assert counts(timer) == {"stop_vote": 1, "gradients": 3}  # only the first step's vote stands alone
    else:
        assert counts(timer) == {"stop_vote": 4, "kl": 3}  # no average to ride: a vote of its own per step
    mine = flat(trainer.model)
    assert all(torch.equal(other, mine) for other in comm.all_gather(mine))


def test_in_models_mode_the_group_stops_together_with_votes_posted_a_step_ahead(comm):
    """Mode models: the last member sees a stop before step 3 and every member stops there; each vote is
    asked about once, a step ahead (the vote about step s + 1 as step s starts), and no vote is posted
    about the step the run ends before."""
    timer = StepTimer()
    group = AgentGroup(comm, SyncConfig(mode="models", every=4), timer, steps=10)
    wired = Wired(3 if comm.rank == comm.size - 1 else None)
    s = 0
    while s < 10 and not group.agree_to_stop(wired, s):  # type: ignore[arg-type]  # the wiring's two parts it reads
        s += 1
    assert s == 3 and wired.asked == [0, 1, 2, 3]
    assert wired.stop.reason == ("a signal" if comm.rank == comm.size - 1 else "an agent-group peer stopped")
    assert counts(timer) == ({} if comm.size == 1 else {"stop_vote": 4})
    ended = AgentGroup(comm, SyncConfig(mode="models", every=4), StepTimer(), steps=3)
    unstopped = Wired(None)
    s = 0
    while s < 3 and not ended.agree_to_stop(unstopped, s):  # type: ignore[arg-type]
        s += 1
    assert s == 3 and unstopped.asked == [0, 1, 2]  # nothing asked, nor posted, about step 3
    comm.barrier()  # nothing is left in flight between the two groups' votes


def test_in_models_mode_a_trainer_runs_a_step_ahead_of_a_slower_one_between_meetings(comm):
    """Rank 0 passes the vote before step 1 while the others are still before step 0's end: they wait to
    hear from rank 0 that it got there. Votes held in lock-step (one collective per step) would leave rank
    0 waiting in its vote about step 1 for the others, and the others waiting for its message: no member
    would get past."""
    if comm.size == 1:
        pytest.skip("a group of one votes with no one")
    group = AgentGroup(comm, SyncConfig(mode="models", every=4), StepTimer(), steps=10)
    wired = Wired(None)
    assert not group.agree_to_stop(wired, 0)  # type: ignore[arg-type]
    if comm.rank == 0:
        assert not group.agree_to_stop(wired, 1)  # type: ignore[arg-type]  # the others' votes about 1: posted at 0
        for peer in range(1, comm.size):
            comm.send(b"at step 1", peer, tag=5, timeout=30)
    else:
        _, note = comm.recv(0, tag=5, timeout=30)
        assert bytes(note.numpy()) == b"at step 1"
        assert not group.agree_to_stop(wired, 1)  # type: ignore[arg-type]
    for s in range(2, 10):
        assert not group.agree_to_stop(wired, s)  # type: ignore[arg-type]
    assert wired.asked == list(range(10))
    comm.barrier()
