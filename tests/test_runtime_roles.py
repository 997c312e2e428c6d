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

HALF_TRAINER = """
from gflowdist.runtime import Trainer


class HalfTrainer(Trainer):
    def setup(self):
        self.ready = True

    def rollout(self, policy_version):
        return {}
"""


def test_rollout_and_loss_are_abstract_and_nothing_else_is():
    assert Actor.__abstractmethods__ == {"rollout"} and Trainer.__abstractmethods__ == {"rollout", "loss"}
    assert not inspect.isabstract(BufferManager) and not inspect.isabstract(Coordinator)


def _trainer_context() -> DistributedContext:
    return DistributedContext.create({"trainers": 1, "buffers": 0, "coordinator": False}, comm=LocalComm())


def test_a_trainer_without_loss_is_refused_naming_class_and_method(tmp_path):
    (tmp_path / "half.py").write_text(HALF_TRAINER)
    config = Config.from_dict(
        {
            "layout": {"trainers": 1, "buffers": 0, "coordinator": False},
            "roles": {"trainer": str(tmp_path / "half.py") + ":HalfTrainer"},
        }
    )
    with pytest.raises(
        GflowdistError,
        match=r"roles\.trainer: \S+HalfTrainer does not implement loss\(\), "
        r"which every trainer needs",
    ):
        make_role(_trainer_context(), config, torch.Generator())


def test_an_unset_trainer_is_refused_as_not_set():
    config = Config.from_dict({"layout": {"trainers": 1, "buffers": 0, "coordinator": False}})
    with pytest.raises(
        GflowdistError,
        match=r"roles\.trainer is not set: a trainer needs your class with "
        r"loss\(\) and rollout\(\)",
    ):
        make_role(_trainer_context(), config, torch.Generator())


def test_the_progress_line_adds_up_counts_and_averages_the_rest():
    """Ints (an actor's env_steps, episodes) are totals over the ranks; floats (a return, a loss) are means."""
    import io

    from gflowdist.runtime.collector import Collector
    from tests.support.wirings import wirings

    layout = {"trainers": 1, "actors": 2, "buffers": 1, "coordinator": False}
    w = wirings(Config.from_dict({"run": {"steps": 10}, "layout": layout}), 4)[0]  # trainer 0 collects
    out = io.StringIO()
    collector = Collector(w, metrics_file=None, out=out)
    collector.record_metrics(0, {"step": 4, "loss": 0.5, "trajectories": 0})
    collector.record_metrics(1, {"step": 3, "env_steps": 100, "episodes": 3, "episode_return": 10.0})
    collector.record_metrics(2, {"step": 3, "env_steps": 150, "episodes": 4, "episode_return": 20.0})
    collector.progress(force=True)
    fields = out.getvalue().split()
    value = {fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)}
    assert (value["env_steps"], value["episodes"]) == ("250", "7")
    assert (value["episode_return"], value["loss"], value["step"]) == ("15", "0.5", "5/10")
