"""The fault policies in one process: a non-finite loss, a refused batch (at the buffer and at its sender), when a
restart may cure a failure."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
import torch

from gflowdist.cli.restarts import Ended, why_not_restart
from gflowdist.config import Config
from gflowdist.errors import BadBatchError, ConfigError, NonFiniteLossError
from gflowdist.replay import ReplayBuffer
from gflowdist.replay.samplers import UniformSampler
from gflowdist.replay.storage import TensorStorage
from gflowdist.replay.writers import RoundRobinWriter
from gflowdist.rundir import write_config
from gflowdist.runtime import protocol
from gflowdist.runtime.faults import check_engine_allows, loss_is_usable, on_refused
from gflowdist.runtime.loops.buffer import BufferLoop
from gflowdist.runtime.roles import BufferManager
from gflowdist.runtime.state import BufferState
from gflowdist.timing.trace import INSTANT
from gflowdist.transport import Message
from tests.support.checkpoints import fake_checkpoint
from tests.support.jobs import TOY
from tests.support.wirings import wirings


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_fails_naming_rank_and_step_or_is_skipped(value):
    loss = torch.tensor(value)
    with pytest.raises(NonFiniteLossError, match=rf"rank 3: the loss is {value} at step 17 \(faults.on_nonfinite"):
        loss_is_usable(loss, mode="fail", rank=3, step=17)
    assert loss_is_usable(loss, mode="skip", rank=3, step=17) is False
    assert loss_is_usable(torch.tensor(0.5), mode="fail", rank=3, step=17) is True


def test_a_refused_batch_fails_its_sender_at_the_step_that_made_it_or_is_dropped():
    with pytest.raises(BadBatchError, match="field 'y'") as caught:
        on_refused("buffer rank 2 refused ... field 'y'", mode="fail", step=5)
    assert caught.value.step == 5
    on_refused("buffer rank 2 refused ... field 'y'", mode="drop", step=5)  # logged, no exception


def _failed(step: int, text: str) -> Ended:
    return Ended(1, f"gflowdist: rank 1 (trainer on vm) failed at step {step}: {text}\nTraceback ...")


def test_what_a_restart_may_cure(tmp_path):
    write_config(tmp_path, Config.from_yaml(TOY), 4, "mpi")
    intact = fake_checkpoint(tmp_path, "gen-0000-step-000000010", 4)
    lost = Ended(3, "gflowdist: lost rank 1 (trainer on vm): no heartbeat for 4.0 s")
    assert why_not_restart(lost, None, tmp_path) is None
    assert why_not_restart(lost, lost, tmp_path) is None  # a lost rank twice may still be cured
    boom = _failed(12, "RuntimeError: boom")
    assert why_not_restart(boom, None, tmp_path) is None
    assert why_not_restart(boom, _failed(15, "RuntimeError: boom"), tmp_path) is None  # another step
    assert "the same exception at step 12" in why_not_restart(boom, _failed(12, "RuntimeError: boom"), tmp_path)
    assert "a config error" in why_not_restart(_failed(0, "ConfigError: roles.trainer: ..."), None, tmp_path)
    assert "stopped from outside" in why_not_restart(Ended(130, None, interrupted=True), None, tmp_path)
    assert "no complete checkpoint" in why_not_restart(lost, None, tmp_path / "elsewhere")
    (intact / "rank-00002.pt").write_bytes(b"damaged")  # the checks a resume makes before it launches
    assert "no intact checkpoint to resume from" in why_not_restart(lost, None, tmp_path)


def test_a_nonzero_exit_explained_by_a_lost_actor_is_a_success(tmp_path):
    (tmp_path / "ledger.json").write_text(json.dumps({"balanced": True, "lost_ranks": {"2": "lost rank 2 (...)"}}))
    assert Ended(137).judged_by(tmp_path, since=0).code == 0
    assert Ended(137, "gflowdist: rank 0 (...) failed: X").judged_by(tmp_path, since=0).code == 137
    assert Ended(137).judged_by(tmp_path, since=float("inf")).code == 137  # an older run's ledger.json
    (tmp_path / "ledger.json").write_text(json.dumps({"balanced": True, "lost_ranks": {}}))
    assert Ended(137).judged_by(tmp_path, since=0).code == 137


def test_a_buffer_refuses_a_shape_changing_batch_naming_sender_field_expected_and_got_and_serves_the_others():
    config = Config.from_dict({"layout": {"trainers": 2, "buffers": 1, "coordinator": False}})
    _, trainer, w = wirings(config, 3, trace=True)  # ranks 0 and 1 are trainers, the clients of buffer rank 2
    host = w.context.host
    manager = BufferManager(rank=2, config=config, generator=torch.Generator(), context=w.context)
    replay = ReplayBuffer(TensorStorage(100), UniformSampler(), RoundRobinWriter())
    loop = BufferLoop(manager, w, BufferState(), replay)

    def offer(sender: int, seq: int, length: int) -> None:
        kind, body = protocol.trajectories({"states": torch.zeros(4, length, 2)}, seq=seq, version=0, n=4)
        loop.admit(Message(kind, sender, 0, body))

    offer(0, 0, 16)
    offer(1, 0, 17)  # per-item shape [17, 2] where the storage holds [16, 2]
    offer(0, 4, 16)
    assert w.ledger.admitted == 8 and w.ledger.dropped == {"bad_batch": 4} and w.ledger.refused == {1: 1}
    assert len(replay) == 8 and w.ledger.received_from == {0: 8, 1: 4}
    assert w.timer.trace is not None
    notes = [(e[1], e[2], e[4]) for e in w.timer.trace.events if e[0] == INSTANT]
    assert notes == [("batch refused", "fault", {"sender": 1, "trajectories": 4})]  # on the buffer's trace
    told = trainer.control.try_recv(2)  # the refusal reached the sender, and only it
    assert told is not None and trainer.control.try_recv(2) is None
    assert told.body["cmd"] == "refused" and told.body["seq"] == 0
    assert told.body["text"] == (
        f"buffer rank 2 (buffer on {host}) refused a batch of 4 trajectories (seq 0-3) from rank 1 "
        f"(trainer on {host}): field 'states': got per-item shape [17, 2] torch.float32, the storage "
        "holds [16, 2] torch.float32"
    )


def test_going_on_without_a_lost_actor_is_refused_on_the_torch_and_local_engines_naming_the_key():
    with pytest.raises(ConfigError, match=r"is continue, but launch.engine is torch: gloo cannot go on") as err:
        Config.from_dict({"faults": {"on_actor_loss": "continue"}, "launch": {"engine": "torch"}})
    assert err.value.key == "faults.on_actor_loss"
    config = Config.from_dict({"faults": {"on_actor_loss": "continue"}})  # engine auto: decided at start-up
    with pytest.raises(ConfigError, match="is continue, but this job runs on the torch engine") as err:
        check_engine_allows(config, "torch")
    with pytest.raises(ConfigError, match=r"launch.engine is local: its ranks are threads of one process") as err:
        Config.from_dict({"faults": {"on_actor_loss": "continue"}, "launch": {"engine": "local"}})
    assert err.value.key == "faults.on_actor_loss"
    check_engine_allows(config, "mpi")
    check_engine_allows(Config.from_dict({"launch": {"engine": "torch"}}), "torch")  # on_actor_loss: fail


def test_a_checkpoint_ack_that_counts_a_refusal_not_heard_yet_waits_for_it_and_fails_before_the_save():
    """The buffer refused my batch, then acknowledged my checkpoint marker (the ack counts the refusal): the
    refusal, sent earlier on the control channel, must fail me (on_bad_batch: fail) before I save past it."""
    from gflowdist.errors import GflowdistError

    def job(mode: str = "fail"):
        faults = {"heartbeat_s": 0.02, "peer_timeout_s": 1.0, "on_bad_batch": mode}
        config = Config.from_dict({"layout": {"trainers": 2, "buffers": 1, "coordinator": False}, "faults": faults})
        collector, me, buffer = wirings(config, 3)  # I am trainer rank 1; my buffer is rank 2
        me.liveness.refusals.shipped(0, step=5)  # my batch seq 0 was made at step 5
        me.liveness.reset()
        return collector, me, buffer

    def meanwhile(collector, buffer, refuse_after: float | None, beats_for: float) -> threading.Thread:
        """The collector beats (a silent one would be lost); the buffer's refusal comes ``refuse_after`` s later."""

        def run() -> None:
            start, refused = time.monotonic(), refuse_after is None
            while time.monotonic() - start < beats_for:
                collector.liveness.heartbeat(-1)
                if not refused and time.monotonic() - start >= refuse_after:
                    buffer.control.isend(*protocol.refused("buffer rank 2 refused a batch ... field 'y'", 0), 1)
                    refused = True
                time.sleep(0.005)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    collector, me, buffer = job()
    beats = meanwhile(collector, buffer, refuse_after=0.1, beats_for=0.3)
    with pytest.raises(BadBatchError, match="field 'y'") as caught:  # not "only 0 refusals reached": it waited
        me.liveness.hear_refusals(1)
    assert caught.value.step == 5 and me.liveness.refusals.heard == 1
    beats.join()
    collector, me, buffer = job(mode="drop")
    beats = meanwhile(collector, buffer, refuse_after=0.1, beats_for=0.3)
    me.liveness.hear_refusals(1)  # counted, and the cut goes on
    assert me.liveness.refusals.heard == 1
    beats.join()
    me.liveness.hear_refusals(0)  # nothing refused: no waiting
    collector, me, buffer = job()
    beats = meanwhile(collector, buffer, refuse_after=None, beats_for=1.5)
    with pytest.raises(GflowdistError, match="refused 1 of my batches, but only 0 refusals reached rank 1"):
        me.liveness.hear_refusals(1)
    beats.join()


def test_replacing_a_lost_actor_is_refused_before_launch_where_it_cannot_be_honoured():
    replace = {"on_actor_loss": "replace", "max_restarts": 1}
    with pytest.raises(ConfigError, match=r"is replace, but launch.engine is torch: a gloo group's world size") as err:
        Config.from_dict({"faults": replace, "launch": {"engine": "torch"}}, file="c.yaml")
    assert err.value.key == "faults.on_actor_loss" and err.value.file == "c.yaml"
    with pytest.raises(ConfigError, match=r"is replace, but launch.engine is local: its ranks are threads"):
        Config.from_dict({"faults": replace, "launch": {"engine": "local"}})
    with pytest.raises(
        ConfigError, match=r"is replace, but faults.max_restarts is 0: .* set faults.max_restarts"
    ) as err:
        Config.from_dict({"faults": {"on_actor_loss": "replace"}})
    assert err.value.key == "faults.on_actor_loss"
    with pytest.raises(ConfigError, match=r"is replace, but layout.inference is 1: a replacement actor reaches only"):
        Config.from_dict({"faults": replace, "layout": {"inference": 1}})
    with pytest.raises(ConfigError, match=r"is replace, but run.record is true \(--record\): a replacement actor"):
        Config.from_dict({"faults": replace, "run": {"record": True}})
    config = Config.from_dict({"faults": replace})  # engine auto: decided at start-up
    with pytest.raises(ConfigError, match="is replace, but this job runs on the torch engine: a gloo group's"):
        check_engine_allows(config, "torch")
    check_engine_allows(config, "mpi")


def test_a_launcher_not_known_to_serve_spawn_is_refused_under_replace_only():
    from gflowdist.cli.preflight import LauncherFacts, check_launcher_spawns

    replace = Config.from_dict({"faults": {"on_actor_loss": "replace", "max_restarts": 1}}, file="c.yaml")
    srun = LauncherFacts("/usr/bin/srun", "slurm 23.02.7")
    with pytest.raises(
        ConfigError, match=r"is replace, but the mpiexec /usr/bin/srun \('slurm 23.02.7'\) is not"
    ) as err:
        check_launcher_spawns(replace, srun)
    assert err.value.key == "faults.on_actor_loss"
    check_launcher_spawns(Config.from_dict({"faults": {"on_actor_loss": "continue"}}), srun)
    for version in ("HYDRA build details:\n    Version: 5.0.2", "mpirun (Open MPI) 5.0.3", "prterun (PMIx) 3.0"):
        check_launcher_spawns(replace, LauncherFacts("/x/mpiexec", version))
