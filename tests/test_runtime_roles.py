"""What a role must implement is abstract; the job runner refuses a class that leaves it out, by name."""

from __future__ import annotations

import inspect

import pytest
import torch

from gflowdist.comm.local import LocalComm
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.errors import GflowdistError
from gflowdist.runtime import Actor, BufferManager, Coordinator, Trainer
from gflowdist.runtime.job import make_role

HALF_TRAINER = '''
from gflowdist.runtime import Trainer


class HalfTrainer(Trainer):
    def setup(self):
        self.ready = True

    def rollout(self, policy_version):
        return {}
'''


def test_rollout_and_loss_are_abstract_and_nothing_else_is():
    assert Actor.__abstractmethods__ == {"rollout"} and Trainer.__abstractmethods__ == {"rollout", "loss"}
    assert not inspect.isabstract(BufferManager) and not inspect.isabstract(Coordinator)


def _trainer_context() -> DistributedContext:
    return DistributedContext.create({"trainers": 1, "buffers": 0, "coordinator": False}, comm=LocalComm())


def test_a_trainer_without_loss_is_refused_naming_class_and_method(tmp_path):
    (tmp_path / "half.py").write_text(HALF_TRAINER)
    config = Config.from_dict({"layout": {"trainers": 1, "buffers": 0, "coordinator": False},
                               "roles": {"trainer": str(tmp_path / "half.py") + ":HalfTrainer"}})
    with pytest.raises(GflowdistError, match=r"roles\.trainer: \S+HalfTrainer does not implement loss\(\), "
                                             r"which every trainer needs"):
        make_role(_trainer_context(), config, torch.Generator())


def test_an_unset_trainer_is_refused_as_not_set():
    config = Config.from_dict({"layout": {"trainers": 1, "buffers": 0, "coordinator": False}})
    with pytest.raises(GflowdistError, match=r"roles\.trainer is not set: a trainer needs your class with "
                                             r"loss\(\) and rollout\(\)"):
        make_role(_trainer_context(), config, torch.Generator())
