"""The learner step: loss values, minibatches, clipping, schedules, the group's step count, bad input.

In one process (an agent group of one, or a fake group for the count check); the
same step with real ranks averaging gradients is in tests/ranked/test_learner_steps.py
and tests/test_example_ppo.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gflowdist.config import Config, LearnerConfig, SyncConfig
from gflowdist.errors import ConfigError, GflowdistError
from gflowdist.runtime import Trainer
from gflowdist.runtime.loops.agent_group import AgentGroup
from gflowdist.runtime.loops.learner_step import LearnerStep, read_loss, split_minibatches
from gflowdist.timing import StepTimer
from tests.support.launching import REPO


class LineTrainer(Trainer):
    """Fits y = x . w; counts what the runtime calls; ``aux`` says what loss returns beside the loss."""

    def setup(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(3, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.seen: list[torch.Tensor] = []
        self.prepared = 0
        self.returns = "dict"

    def rollout(self, policy_version):
        return None

    def prepare(self, batch):
        self.prepared += 1
        return {**batch, "target": batch["y"] * 1.0}

    def loss(self, batch):
        self.seen.append(batch["i"].clone())
        loss = ((self.model(batch["x"]).squeeze(-1) - batch["target"]) ** 2).mean()
        if self.returns == "tensor":
            return loss
        return {"loss": loss, "items": float(len(batch["i"])), "half": torch.tensor(0.5), "count": 3}


def make_trainer() -> LineTrainer:
    trainer = LineTrainer(rank=0, config=None, generator=torch.Generator().manual_seed(1))
    trainer.setup()
    return trainer


def make_step(trainer: Trainer, **learner) -> LearnerStep:
    group = AgentGroup(None, SyncConfig(), StepTimer())
    return LearnerStep(
        trainer, group, LearnerConfig(**learner), StepTimer(), rank=0, on_nonfinite="fail", note_skip=lambda step: None
    )


def batch(n: int = 12) -> dict:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 3, generator=g)
    return {"x": x, "y": x @ torch.tensor([1.0, -2.0, 0.5]), "i": torch.arange(n), "tag": "kept"}


def test_epochs_times_minibatches_optimizer_steps_each_item_once_per_epoch():
    trainer = make_trainer()
    step = make_step(trainer, epochs=3, minibatches=4, batch_size=12)
    values = step(batch(), step=0)
    assert trainer.prepared == 1 and len(trainer.seen) == 12
    for epoch in range(3):  # each epoch deals every item once, in minibatches of 3
        parts = trainer.seen[4 * epoch : 4 * epoch + 4]
        assert [len(p) for p in parts] == [3, 3, 3, 3]
        assert sorted(torch.cat(parts).tolist()) == list(range(12))
    assert trainer.seen[0].tolist() != list(range(3)) or trainer.seen[4].tolist() != list(range(3))  # shuffled
    assert values["items"] == 3.0 and values["half"] == 0.5 and values["count"] == 3.0
    assert set(values) == {"loss", "items", "half", "count"}


def test_one_epoch_one_minibatch_is_one_loss_of_the_whole_batch():
    trainer = make_trainer()
    trainer.returns = "tensor"
    before = trainer.model.weight.detach().clone()
    values = make_step(trainer)(batch(), step=0)
    assert [t.tolist() for t in trainer.seen] == [list(range(12))] and set(values) == {"loss"}
    expected = before.clone().requires_grad_(True)
    b = batch()
    loss = ((b["x"] @ expected.T).squeeze(-1) - b["y"]).pow(2).mean()
    loss.backward()
    torch.testing.assert_close(trainer.model.weight.detach(), before - 0.1 * expected.grad)
    assert values["loss"] == pytest.approx(float(loss.detach()))


def test_gradients_are_clipped_to_the_global_norm_before_the_step():
    trainer = make_trainer()
    before = trainer.model.weight.detach().clone()
    values = make_step(trainer, max_grad_norm=0.01)(batch(), step=0)
    moved = (trainer.model.weight.detach() - before).norm()
    assert values["grad_norm"] > 0.01  # the norm before clipping
    assert float(moved) == pytest.approx(0.1 * 0.01, rel=1e-4)  # lr x the clipped norm (torch adds 1e-6 to the norm)


def test_the_schedule_steps_once_per_trainer_step_and_is_checkpointed():
    trainer = make_trainer()
    trainer.scheduler = torch.optim.lr_scheduler.StepLR(trainer.optimizer, step_size=1, gamma=0.5)
    step = make_step(trainer, epochs=2, minibatches=2, batch_size=12)
    lrs = [step(batch(), step=s)["lr"] for s in range(3)]
    assert lrs == [0.05, 0.025, 0.0125]
    state = trainer.state_dict()
    assert state["scheduler"]["last_epoch"] == 3
    restored = make_trainer()
    restored.scheduler = torch.optim.lr_scheduler.StepLR(restored.optimizer, step_size=1, gamma=0.5)
    restored.load_state_dict(state)
    assert restored.scheduler.last_epoch == 3 and restored.optimizer.param_groups[0]["lr"] == 0.0125


class BadTrainer(LineTrainer):
    def loss(self, batch):
        return self.bad(batch, ((self.model(batch["x"]).squeeze(-1) - batch["target"]) ** 2))


@pytest.mark.parametrize(
    "bad,message",
    [
        (lambda b, per_item: per_item, r"BadTrainer\.loss\(\) returned a tensor of shape \[12\]: expected a scalar"),
        (lambda b, per_item: 1.0, r"BadTrainer\.loss\(\) returned float: expected a scalar tensor"),
        (
            lambda b, per_item: {"loss": per_item.mean(), "entropy": "high"},
            r"BadTrainer\.loss\(\) returned 'entropy' as str 'high': auxiliary values are numbers",
        ),
        (
            lambda b, per_item: {"loss": per_item.mean(), "kl": per_item},
            r"BadTrainer\.loss\(\) returned 'kl' as a tensor of shape \[12\]",
        ),
        (
            lambda b, per_item: {"policy_loss": per_item.mean()},
            r"BadTrainer\.loss\(\) returned a dict without 'loss' \(keys \['policy_loss'\]\)",
        ),
        (
            lambda b, per_item: {"loss": per_item},
            r"BadTrainer\.loss\(\) returned 'loss' as a tensor of shape \[12\]",
        ),
    ],
)
def test_a_loss_that_is_not_a_scalar_or_numbers_is_named(bad, message):
    trainer = make_trainer()
    trainer.__class__ = BadTrainer
    trainer.bad = bad
    with pytest.raises(GflowdistError, match=message):
        make_step(trainer)(batch(), step=0)


def test_read_loss_accepts_a_scalar_or_a_dict():
    loss, aux = read_loss(torch.tensor([2.0]), "T.loss()")
    assert loss.shape == () and aux == {}
    loss, aux = read_loss({"loss": torch.tensor(1.0), "kl": torch.tensor([0.25]), "n": 4}, "T.loss()")
    assert float(loss) == 1.0 and aux == {"kl": 0.25, "n": 4.0}
    with pytest.raises(GflowdistError, match="returned 'flag' as bool"):
        read_loss({"loss": torch.tensor(1.0), "flag": True}, "T.loss()")


def test_a_batch_of_another_size_than_learner_batch_size_is_named():
    trainer = make_trainer()
    with pytest.raises(
        GflowdistError, match=r"learner batch at step 4 holds 10 items .*LineTrainer.rollout\(\).*batch_size is 12"
    ):
        make_step(trainer, minibatches=2, batch_size=12)(batch(10), step=4)


def test_split_minibatches_keeps_values_that_are_not_tensors_and_refuses_ragged_fields():
    g = torch.Generator().manual_seed(0)
    parts = split_minibatches(batch(), 3, g, "T.prepare()")
    assert [p["tag"] for p in parts] == ["kept"] * 3
    for p in parts:  # every field dealt alike
        torch.testing.assert_close(p["x"], batch()["x"][p["i"]])
    with pytest.raises(GflowdistError, match=r"different leading sizes \{'x': 12, 'short': 5"):
        split_minibatches({"x": torch.zeros(12, 2), "short": torch.zeros(5)}, 2, g, "T.prepare()")


class FakeGroupComm:
    """A group of three whose members say how many optimizer steps they take."""

    size = 3

    def __init__(self, counts):
        self.counts = counts

    def world_rank(self, r):
        return 10 + r

    def all_gather(self, x):
        return [torch.tensor([c]) for c in self.counts]


def test_a_group_whose_members_take_different_step_counts_fails_naming_each_rank():
    group = AgentGroup(FakeGroupComm([8, 8, 8]), SyncConfig(mode="gradients"), StepTimer())
    group.check_same_steps(8)
    group = AgentGroup(FakeGroupComm([8, 4, 8]), SyncConfig(mode="gradients"), StepTimer())
    with pytest.raises(GflowdistError, match=r"\(rank 10: 8, rank 11: 4, rank 12: 8\)"):
        group.check_same_steps(8)
    AgentGroup(FakeGroupComm([8, 4, 8]), SyncConfig(mode="none"), StepTimer()).check_same_steps(8)  # nothing averaged


def test_a_split_that_does_not_divide_the_batch_is_refused_naming_key_and_file(tmp_path):
    path = tmp_path / "ppo.yaml"
    path.write_text("learner: {epochs: 4, minibatches: 3, batch_size: 512}\n")
    with pytest.raises(ConfigError) as caught:
        Config.from_yaml(path)
    text = str(caught.value)
    assert str(path) in text and "learner.minibatches" in text and "does not divide learner.batch_size 512" in text
    with pytest.raises(ConfigError, match=r"learner\.minibatches: is 4 but learner\.batch_size is null"):
        Config.from_dict({"learner": {"minibatches": 4}})


def test_gflowdist_run_refuses_the_split_in_one_line_before_launch(tmp_path):
    config = REPO / "examples" / "ppo_cartpole" / "config.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "gflowdist", "run", str(config), "learner.minibatches=3", f"run.out_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "learner.minibatches" in lines[0] and "does not divide learner.batch_size 512" in lines[0]
    )
    assert not any(tmp_path.iterdir())  # no run directory


class KLTrainer(LineTrainer):
    """Reports the KL values of ``kls`` in turn (under ``approx_kl``), one per loss call."""

    kls: tuple[float, ...] = ()

    def loss(self, batch):
        out = super().loss(batch)
        return {**out, "approx_kl": self.kls[len(self.seen) - 1]}


def test_target_kl_ends_the_epochs_at_the_first_minibatch_above_one_and_a_half_times_it():
    trainer = KLTrainer(rank=0, config=None, generator=torch.Generator().manual_seed(1))
    trainer.setup()
    trainer.kls = (0.0, 0.01, 0.02, 0.01, 0.02, 0.04, 0.0, 0.0)  # 0.04 > 1.5 x 0.02, at the 2nd epoch's 2nd
    before = trainer.model.weight.detach().clone()
    values = make_step(trainer, epochs=2, minibatches=4, batch_size=12, target_kl=0.02)(batch(), step=0)
    assert len(trainer.seen) == 6 and values["optimizer_steps"] == 5.0
    assert values["approx_kl"] == pytest.approx(sum(trainer.kls[:6]) / 6)  # every minibatch evaluated
    # the 6th minibatch took no step: the weights are those after 5 steps of the same minibatches
    reference = make_trainer()
    assert torch.equal(reference.model.weight.detach(), before)
    for part in trainer.seen[:5]:
        b = batch()
        minibatch = {"x": b["x"][part], "target": b["y"][part]}
        reference.optimizer.zero_grad()
        ((reference.model(minibatch["x"]).squeeze(-1) - minibatch["target"]) ** 2).mean().backward()
        reference.optimizer.step()
    torch.testing.assert_close(trainer.model.weight.detach(), reference.model.weight.detach())
    trainer.seen.clear()
    trainer.kls = (0.0,) * 8
    values = make_step(trainer, epochs=2, minibatches=4, batch_size=12, target_kl=0.02)(batch(), step=1)
    assert len(trainer.seen) == 8 and values["optimizer_steps"] == 8.0  # below the bound: every step


def test_target_kl_without_the_kl_among_the_loss_values_is_named():
    trainer = make_trainer()
    step = make_step(trainer, epochs=2, minibatches=2, batch_size=12, target_kl=0.01, kl_key="kl")
    with pytest.raises(GflowdistError, match=r"LineTrainer\.loss\(\) returned no 'kl' \(auxiliary values: \['count'"):
        step(batch(), step=0)
    with pytest.raises(ConfigError, match=r"learner\.target_kl"):
        Config.from_dict({"learner": {"target_kl": 0}})
