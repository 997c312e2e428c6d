"""Tiny roles for runtime tests: a linear model learning y = x . w from generated data.

Fast (a few ms a step) so end-to-end tests spend their time on the framework.
Behaviour switches come from ``params`` (fail_after, delay_s, ...), and one from
the environment, since a replay runs the recorded params: with
``GFLOWDIST_TEST_PERTURB=<rank>:<version>`` that trainer's rollout at that
policy version changes by a hair (an injected divergence).
"""

from __future__ import annotations

import os
import time

import torch

from gflowdist.runtime import Actor, BufferManager, Coordinator, Trainer

TRUE_W = torch.tensor([1.0, -2.0, 0.5, 3.0])


def make_batch(n, generator):
    x = torch.randn(n, 4, generator=generator)
    y = x @ TRUE_W
    return {"x": x, "y": y, "log_rewards": -y.abs()}


def _delay(params, generator):
    delay = float(params.get("delay_s", 0.0))
    if delay:
        time.sleep(delay * float(torch.rand(1, generator=generator)))


class ToyTrainer(Trainer):
    def setup(self):
        self.model = torch.nn.Linear(4, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.n = int(self.params.get("n", 8))

    def rollout(self, policy_version):
        _delay(self.params, self.generator)
        if self.params.get("fail_in_trainer") and policy_version >= int(self.params["fail_in_trainer"]):
            raise RuntimeError("toy trainer failure on purpose")
        batch = make_batch(self.n, self.generator)
        if os.environ.get("GFLOWDIST_TEST_PERTURB") == f"{self.rank}:{policy_version}":
            batch["y"] = batch["y"] + 1e-6
        return batch

    def loss(self, batch):
        return ((self.model(batch["x"]).squeeze(-1) - batch["y"]) ** 2).mean()

    def metrics(self):
        return {"w_error": float((self.model.weight.detach().flatten() - TRUE_W).norm())}

    def summary(self):
        return {"device": str(self.device)}


class ToyActor(Actor):
    def setup(self):
        self.model = torch.nn.Linear(4, 1, bias=False)
        self.n = int(self.params.get("n", 8))
        self.versions_seen = []

    def rollout(self, policy_version):
        _delay(self.params, self.generator)
        time.sleep(0.002)
        return make_batch(self.n, self.generator)

    def load_weights(self, state, version):
        super().load_weights(state, version)
        self.versions_seen.append(version)

    def summary(self):
        return {"weight_updates": len(self.versions_seen), "device": str(self.device)}


class ToyBuffer(BufferManager):
    def setup(self):
        self.admitted = 0

    def on_admitted(self, batch):
        _delay(self.params, self.generator)
        self.admitted += batch["x"].shape[0]
        fail_after = self.params.get("fail_in_buffer_after")
        if fail_after is not None and self.admitted >= int(fail_after):
            raise ValueError("toy buffer failure on purpose")

    def summary(self):
        return {"admitted_here": self.admitted, "device": str(self.device)}


class ToyCoordinator(Coordinator):
    def setup(self):
        self.summaries = 0

    def on_summary(self, rank, summary):
        self.summaries += 1

    def summary(self):
        return {"summaries_seen": self.summaries, "device": str(self.device)}
