"""A buffer rank's queue (one process, the loop's own methods on real wirings of thread ranks): stale unrolls dropped and counted, a full
queue parking batches instead of overwriting (and keeping them across a checkpoint), and an unroll whose
length changed refused naming the sender."""

from __future__ import annotations

import torch

from gflowdist.config import Config
from gflowdist.replay import ReplayBuffer
from gflowdist.rl import UnrollActor, categorical_actions
from gflowdist.runtime import protocol
from gflowdist.runtime.ledger import Ledger, check_ledgers
from gflowdist.runtime.loops.buffer import BufferLoop
from gflowdist.runtime.roles import BufferManager
from gflowdist.runtime.state import BufferState
from gflowdist.timing.summaries import LEDGER_KEYS, ledger_summary
from gflowdist.transport import Message, MessageType
from tests.support.wirings import wirings


class RandomUnrolls(UnrollActor):
    def act(self, obs):
        return categorical_actions(torch.zeros(obs.shape[0], self.num_actions), self.generator)


def unroll_maker(length: int) -> RandomUnrolls:
    config = Config.from_dict({"params": {"env_id": "CartPole-v1", "envs_per_actor": 2, "unroll_length": length}})
    actor = RandomUnrolls(rank=1, config=config, generator=torch.Generator().manual_seed(length))
    actor.setup()
    return actor


def buffer_loop(capacity: int, max_staleness: int | None, ledger: Ledger | None = None):
    """Buffer rank 3's loop on a real wiring (4 thread ranks: trainer 0, actors 1-2, buffer 3), and the wirings:
    what it sends arrives at the others' channels. ``ledger``: the buffer's to start from (a resumed one's)."""
    layout = {"trainers": 1, "actors": 2, "buffers": 1, "coordinator": False}
    config = Config.from_dict({"layout": layout, "replay": {"max_staleness": max_staleness}})
    ws = wirings(config, 4, ledgers={3: ledger} if ledger is not None else None)
    manager = BufferManager(rank=3, config=config, generator=torch.Generator(), context=ws[3].context)
    return BufferLoop(manager, ws[3], BufferState(), ReplayBuffer.queue(capacity)), ws


def reply(ws) -> Message:
    """The sample reply buffer rank 3 sent trainer rank 0 last (each request is answered at once)."""
    return ws[0].data.recv(3, timeout=10)


def refusal(ws, rank: int) -> Message:
    """The refusal buffer rank 3 sent ``rank`` (on the control channel)."""
    msg = ws[rank].control.recv(3, timeout=10)
    assert ws[rank].control.try_recv(3) is None  # one refusal, not two
    return msg


def send(loop, sender: int, seq: int, batch: dict, version: int) -> None:
    kind, body = protocol.trajectories(batch, seq=seq, version=version, n=2)
    loop.handle(Message(kind, sender, seq, body))


def ask(loop, n: int, version: int) -> None:
    kind, body = protocol.sample_request(n, version)
    loop.handle(Message(kind, 0, 0, body))


def test_a_queue_drops_stale_unrolls_parks_what_does_not_fit_and_its_ledger_balances():
    loop, ws = buffer_loop(capacity=4, max_staleness=2)
    w = ws[3]
    actor = unroll_maker(8)
    for seq, version in ((0, 0), (2, 0), (4, 3)):  # 6 unrolls for a queue of 4: the third batch is parked
        send(loop, 1, seq, actor.rollout(version), version)
    assert len(loop.replay) == 4 and len(loop.parked) == 1 and w.ledger.evicted == 0
    ask(loop, 2, version=3)  # lag 3 > 2: all four version-0 unrolls are dropped unserved, none served
    assert w.ledger.dropped == {"stale": 4} and w.ledger.expired == 4
    answer = reply(ws)  # to trainer rank 0, which asked
    assert answer.type is MessageType.SAMPLE_REPLY and answer.body.get("batch") is None
    assert len(loop.replay) == 2 and not loop.parked  # room again: the parked batch (version 3) is admitted
    ask(loop, 2, version=4)
    body = reply(ws).body
    assert body["batch"]["obs"].shape == (2, 8, 4) and body["versions"].tolist() == [3, 3]
    send(loop, 2, 0, actor.rollout(0), 0)  # lag 4 at admission (version 4 heard): dropped on arrival
    loop.drop_parked()
    assert w.ledger.dropped == {"stale": 6} and w.ledger.admitted == 6 and w.ledger.received == 8
    ledgers = {1: Ledger(produced=6, sent=6), 2: Ledger(produced=2, sent=2), 3: w.ledger}
    totals = check_ledgers(ledgers)
    assert totals["expired"] == 4 and totals["dropped"] == 6
    # the report's balance counts an expired unroll once: produced 8 = admitted 6 + dropped 6 - expired 4
    summary = ledger_summary(
        {r: {k: v for k, v in item.to_dict().items() if k in LEDGER_KEYS} for r, item in ledgers.items()}
    )
    assert (
        summary.balanced
        and "dropped 6 - expired 4 (admitted, then dropped: stale, unlearned)" in summary.balance_line()
    )


def test_what_a_full_queue_still_parks_at_the_end_is_dropped_as_queue_full():
    loop, ws = buffer_loop(capacity=2, max_staleness=None)
    w = ws[3]
    actor = unroll_maker(4)
    send(loop, 1, 0, actor.rollout(0), 0)
    send(loop, 1, 2, actor.rollout(0), 0)
    loop.drop_parked()
    assert w.ledger.admitted == 2 and w.ledger.dropped == {"queue_full": 2}
    check_ledgers({1: Ledger(produced=4, sent=4), 3: w.ledger})


def test_an_unroll_whose_length_changed_is_refused_naming_sender_field_expected_and_got():
    loop, ws = buffer_loop(capacity=8, max_staleness=None)
    w, host = ws[3], ws[3].context.host
    send(loop, 1, 0, unroll_maker(8).rollout(0), 0)
    send(loop, 2, 0, unroll_maker(6).rollout(0), 0)
    assert w.ledger.admitted == 2 and w.ledger.dropped == {"bad_batch": 2} and w.ledger.refused == {2: 1}
    assert refusal(ws, 2).body["text"] == (
        f"buffer rank 3 (buffer on {host}) refused a batch of 2 trajectories (seq 0-1) from rank 2 (actor on {host}): "
        "field 'obs': got per-item shape [6, 4] torch.float32, the storage holds [8, 4] torch.float32"
    )


def test_a_checkpoint_keeps_the_parked_batches_and_the_resumed_queue_serves_them_with_the_ledger_exact(tmp_path):
    actor = unroll_maker(4)
    batches = [actor.rollout(v) for v in (0, 0, 1, 1)]  # 8 unrolls for a queue of 4: two batches parked

    def fill(loop):
        for index, batch in enumerate(batches):
            send(loop, 1 + index % 2, index, batch, index // 2)

    def drain(loop, ws):
        served = []
        for version in (1, 2, 3):
            ask(loop, 2, version)
            served.append(reply(ws).body["batch"]["obs"])
        loop.drop_parked()
        return torch.cat(served)

    straight, ws = buffer_loop(capacity=4, max_staleness=None)  # the run without a cut
    w = ws[3]
    fill(straight)
    expected = drain(straight, ws)
    cut, ws_cut = buffer_loop(capacity=4, max_staleness=None)
    w_cut = ws_cut[3]
    fill(cut)
    assert len(cut.parked) == 2 and w_cut.ledger.received == 8 and w_cut.ledger.admitted == 4
    part = tmp_path / "rank-00003.pt"  # what the checkpoint saver writes and a resume loads
    torch.save(
        {"runtime": cut.state.to_dict(), "replay": cut.replay.state_dict(), "ledger": w_cut.ledger.to_dict()}, part
    )
    saved = torch.load(part, weights_only=True)
    resumed, ws_resumed = buffer_loop(capacity=4, max_staleness=None, ledger=Ledger.from_dict(saved["ledger"]))
    w_resumed = ws_resumed[3]
    resumed.state.load(saved["runtime"])
    resumed.replay.load_state_dict(saved["replay"])
    assert [m.sender for m in resumed.parked] == [1, 2] and [m.body["seq"] for m in resumed.parked] == [2, 3]
    assert torch.equal(drain(resumed, ws_resumed), expected)  # the same unrolls, in the same order
    assert w_resumed.ledger.admitted == w.ledger.admitted == 8 and not w_resumed.ledger.dropped
    check_ledgers({1: Ledger(produced=4, sent=4), 2: Ledger(produced=4, sent=4), 3: w_resumed.ledger})


def test_a_prefetched_queue_reply_read_at_a_cut_is_counted_unlearned_and_the_ledger_stays_exact():
    from gflowdist.runtime.loops.trainer import ReplayRequests

    loop, ws = buffer_loop(capacity=8, max_staleness=None)
    w_buffer = ws[3]
    actor = unroll_maker(4)
    send(loop, 1, 0, actor.rollout(0), 0)
    send(loop, 1, 2, actor.rollout(0), 0)
    ask(loop, 2, version=0)  # a learner's prefetched request: served once, then read and dropped at the cut
    served = reply(ws)
    for sampler, counted in (("queue", 2), ("uniform", 0)):
        layout = {"trainers": 1, "actors": 2, "buffers": 1, "coordinator": False}
        job = wirings(Config.from_dict({"layout": layout, "replay": {"sampler": sampler, "learner_batch": 2}}), 4)
        job[3].data.isend(MessageType.SAMPLE_REPLY, served.body, 0)  # on its way to trainer rank 0 at the cut
        trainer = job[0]
        requests = ReplayRequests(trainer, buffer=3)
        requests.outstanding = 1
        requests.settle()
        assert requests.outstanding == 0
        assert trainer.ledger.dropped.get("unlearned", 0) == counted and trainer.ledger.expired == counted
        ledgers = {1: Ledger(produced=4, sent=4), 3: w_buffer.ledger, 0: trainer.ledger}
        assert check_ledgers(ledgers)["dropped"] == counted  # served, then dropped by the learner: balanced


def test_an_unroll_whose_fields_changed_is_refused_naming_sender_and_the_fields():
    loop, ws = buffer_loop(capacity=8, max_staleness=None)
    w, host = ws[3], ws[3].context.host
    send(loop, 1, 0, unroll_maker(4).rollout(0), 0)
    config = Config.from_dict(
        {"params": {"env_id": "CartPole-v1", "envs_per_actor": 2, "unroll_length": 4, "record_logits": True}}
    )
    recording = RandomUnrolls(rank=2, config=config, generator=torch.Generator().manual_seed(4))
    recording.setup()
    batch = recording.rollout(0)  # with the behaviour policy's logits beside the fields sent before
    send(loop, 2, 0, batch, 0)
    assert w.ledger.admitted == 2 and w.ledger.dropped == {"bad_batch": 2} and w.ledger.refused == {2: 1}
    assert refusal(ws, 2).body["text"] == (
        f"buffer rank 3 (buffer on {host}) refused a batch of 2 trajectories (seq 0-1) from rank 2 (actor on {host}): "
        "batch fields differ from the stored schema: missing [], unexpected ['behaviour_logits']"
    )
