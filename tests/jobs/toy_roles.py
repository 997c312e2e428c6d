"""Tiny roles for runtime tests: a linear model learning y = x . w from generated data.

Fast (a few ms a step) so end-to-end tests spend their time on the framework.
Behaviour switches come from ``params`` (fail_after, delay_s: every rollout and every admitted batch sleeps up to
that long, ``admit_delay_s``: the buffer's sleep instead, ``slow_s``
[/``slow_from``]: each trainer rollout from that policy version on sleeps
``slow_s``, a window for a test to kill a rank in); faults:
``retype_rank``/``retype_at`` (that trainer's ``y`` turns float64 from that
policy version on: batches its buffer refuses), ``setup_rank``/``setup_s`` (that
rank's setup() sleeps: a window to kill it in), ``final_summary_s`` (the coordinator's
final summary sleeps: a stop that cannot finish soon), ``nan_rank``/``nan_at``
[/``nan_until``] (that trainer's loss is NaN at those steps), ``loss_fail_rank``/``loss_fail_at`` (that
trainer's ``loss()`` raises from that step on), ``mistake_rank``/``mistake``[/``mistake_at``] (that trainer's
rollout makes a user's mistake from that policy version on: ``list`` returns a list of tensors, ``rows``
gives ``y`` one row less than ``x``, ``grow`` gives ``x`` 5 columns instead of 4, ``nan`` puts a NaN in
``log_rewards``' row 2); ``exit_marks`` (a folder: how a rank's process ends, see :func:`_exit_marks`);
``fail_standin`` (an actor that replaces a lost one, ``faults.on_actor_loss: replace``, fails in its
setup()); ``actor_metrics`` (actors report metrics rows: their trajectory count and weight updates).

The trainers step a :class:`PlainSGD`, not ``torch.optim.SGD``: the first call into ``torch.optim`` imports
``torch._dynamo`` (about 1.3 CPU-s per trainer process, measured with torch 2.13), which every trainer rank of
the suite's toy jobs would pay for nothing these tests check. ``torch.optim`` in a job is exercised by the
examples' jobs (HyperGrid's Adam: tests/test_console_end.py, test_trace_replay.py, ...) and by
tests/test_learner_step.py (SGD with an lr schedule, saved and restored).
"""

from __future__ import annotations

import atexit
import gc
import os
import threading
import time

import torch

from gflowdist.runtime import Actor, BufferManager, Coordinator, Trainer

TRUE_W = torch.tensor([1.0, -2.0, 0.5, 3.0])


class PlainSGD:
    """``p -= lr * p.grad`` for every parameter with a gradient: the part of ``torch.optim.Optimizer``'s
    interface the runtime uses (``param_groups``, ``zero_grad``, ``step``, ``state_dict``/``load_state_dict``)."""

    def __init__(self, params, lr: float):
        self.param_groups = [{"params": list(params), "lr": float(lr)}]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if set_to_none:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.add_(param.grad, alpha=-group["lr"])

    def state_dict(self) -> dict:
        return {"param_groups": [{"lr": group["lr"]} for group in self.param_groups]}

    def load_state_dict(self, state: dict) -> None:
        for group, saved in zip(self.param_groups, state["param_groups"], strict=True):
            group["lr"] = float(saved["lr"])


def make_batch(n, generator):
    x = torch.randn(n, 4, generator=generator)
    y = x @ TRUE_W
    return {"x": x, "y": y, "log_rewards": -y.abs()}


def _setup_pause(role):
    """``params.setup_rank``/``setup_s``: that rank's setup() takes ``setup_s`` (a window to kill it in)."""
    if role.params.get("setup_rank") == role.rank:
        time.sleep(float(role.params.get("setup_s", 60)))


def _exit_marks(role):
    """``params.exit_marks`` (a folder): a non-daemon thread that writes ``thread-N`` there 0.5 s after the run's
    ledger.json appeared (the job is over: every rank is ending), and an atexit handler that writes ``atexit-N``
    saying whether ``thread-N`` was there by then and whether the run's objects were frozen for its exit
    (gflowdist.cli.rank_end.freeze_for_exit)."""
    folder, run_dir = role.params.get("exit_marks"), os.environ.get("GFLOWDIST_RUN_DIR")
    if not folder or not run_dir:
        return
    mark = os.path.join(folder, f"thread-{role.rank}")

    def after_the_job():
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(run_dir, "ledger.json")) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        _write(mark, "done")

    threading.Thread(target=after_the_job, daemon=False).start()
    inherited = gc.get_freeze_count()  # a warm start's rank inherits the warm parent's frozen imports
    atexit.register(
        lambda: _write(
            os.path.join(folder, f"atexit-{role.rank}"),
            f"thread mark {os.path.exists(mark)} frozen {gc.get_freeze_count() > inherited}",
        )
    )


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _delay(params, generator, key="delay_s"):
    delay = float(params.get(key, params.get("delay_s", 0.0)))
    if delay:
        time.sleep(delay * float(torch.rand(1, generator=generator)))


class ToyTrainer(Trainer):
    def setup(self):
        _setup_pause(self)
        _exit_marks(self)
        self.steps_seen = 0  # loss() calls: the step, in this run and the runs it resumed
        self.model = torch.nn.Linear(4, 1, bias=False)
        self.optimizer = PlainSGD(self.model.parameters(), lr=0.05)
        self.n = int(self.params.get("n", 8))

    def rollout(self, policy_version):
        _delay(self.params, self.generator)
        if self.params.get("slow_s") and policy_version >= int(self.params.get("slow_from", 0)):
            time.sleep(float(self.params["slow_s"]))
        if self.params.get("fail_in_trainer") and policy_version >= int(self.params["fail_in_trainer"]):
            raise RuntimeError("toy trainer failure on purpose")
        batch = make_batch(self.n, self.generator)
        if self._mine("retype") and policy_version >= int(self.params["retype_at"]):
            batch["y"] = batch["y"].double()  # a batch its buffer cannot store next to the others
        if self.params.get("mistake_rank") == self.rank and policy_version >= int(self.params.get("mistake_at", 0)):
            return self._mistake(batch)
        return batch

    def _mistake(self, batch):
        kind = self.params["mistake"]
        if kind == "list":
            return list(batch.values())
        if kind == "rows":
            return {**batch, "y": batch["y"][:-1]}
        if kind == "grow":
            return {**batch, "x": torch.randn(self.n, 5, generator=self.generator)}
        if kind == "nan":
            batch["log_rewards"][2] = float("nan")
            return batch
        raise ValueError(f"params.mistake must be list, rows, grow or nan, not {kind!r}")

    def loss(self, batch):
        if self._mine("loss_fail") and self.steps_seen >= int(self.params["loss_fail_at"]):
            raise RuntimeError("toy loss failure on purpose")
        loss = ((self.model(batch["x"][:, :4]).squeeze(-1) - batch["y"]) ** 2).mean()
        if self._mine("nan") and int(self.params["nan_at"]) <= self.steps_seen < int(
            self.params.get("nan_until", int(self.params["nan_at"]) + 1)
        ):
            loss = loss * float("nan")
        self.steps_seen += 1
        return loss

    def _mine(self, fault: str) -> bool:
        """``params.<fault>_rank`` names this rank (and ``<fault>_at`` is set)."""
        return self.params.get(f"{fault}_rank") == self.rank and self.params.get(f"{fault}_at") is not None

    def state_dict(self):
        return {**super().state_dict(), "steps_seen": self.steps_seen}

    def load_state_dict(self, state):
        state = dict(state)
        self.steps_seen = int(state.pop("steps_seen", 0))
        super().load_state_dict(state)

    def metrics(self):
        return {"w_error": float((self.model.weight.detach().flatten() - TRUE_W).norm())}

    def summary(self):
        return {"device": str(self.device)}


class ToyActor(Actor):
    def setup(self):
        self.model = torch.nn.Linear(4, 1, bias=False)
        self.n = int(self.params.get("n", 8))
        self.versions_seen = []
        if self.params.get("fail_standin") and os.environ.get("GFLOWDIST_STANDIN"):  # a replacement (gflowdist.standin)
            raise RuntimeError("the toy actor's replacement fails on purpose")

    def rollout(self, policy_version):
        _delay(self.params, self.generator)
        time.sleep(0.002)
        return make_batch(self.n, self.generator)

    def load_weights(self, state, version):
        super().load_weights(state, version)
        self.versions_seen.append(version)

    def metrics(self):
        return {"weight_updates": len(self.versions_seen)} if self.params.get("actor_metrics") else {}

    def summary(self):
        return {"weight_updates": len(self.versions_seen), "device": str(self.device)}


class ToyBuffer(BufferManager):
    def setup(self):
        _setup_pause(self)
        _exit_marks(self)
        self.admitted = 0

    def on_admitted(self, batch):
        _delay(self.params, self.generator, "admit_delay_s")
        self.admitted += batch["x"].shape[0]
        fail_after = self.params.get("fail_in_buffer_after")
        if fail_after is not None and self.admitted >= int(fail_after):
            raise ValueError("toy buffer failure on purpose")

    def summary(self):
        return {"admitted_here": self.admitted, "device": str(self.device)}


class ToyCoordinator(Coordinator):
    def setup(self):
        _setup_pause(self)
        _exit_marks(self)
        self.summaries = 0

    def on_summary(self, rank, summary):
        self.summaries += 1

    def summary(self):
        time.sleep(float(self.params.get("final_summary_s", 0)))  # called once, for the final report
        return {"summaries_seen": self.summaries, "device": str(self.device)}
