"""Toy trainers that slip on their device (tests/test_device_errors.py).

``MisplacedTrainer`` builds its model on the ``meta`` device while the trainer
computes on the CPU (the slip of a model left on the CPU in a CUDA trainer,
made testable without a GPU); ``MemoryHungryTrainer`` raises torch's own
``OutOfMemoryError`` from its loss at learner step ``params.oom_at``, as a GPU
that ran out of memory does.
"""

from __future__ import annotations

import torch

from gflowdist.config.classes import load_class

ToyTrainer = load_class("toy_roles.py:ToyTrainer", key="roles.trainer", file=__file__)
PlainSGD = load_class("toy_roles.py:PlainSGD", key="roles.trainer", file=__file__)


class MisplacedTrainer(ToyTrainer):
    def setup(self):
        super().setup()
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
        self.model[1].to("meta")  # the second layer is not on the trainer's device
        self.optimizer = PlainSGD(self.model.parameters(), lr=0.05)


class MemoryHungryTrainer(ToyTrainer):
    def loss(self, batch):
        if self.steps_seen == int(self.params["oom_at"]):
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)"
            )
        return super().loss(batch)
