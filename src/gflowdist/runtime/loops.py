"""The default event loop of each role (see :mod:`gflowdist.runtime.roles` for the contract)."""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from typing import Mapping

import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.polling import Backoff
from gflowdist.errors import DeadlineError, GflowdistError, PeerLostError, ProtocolError
from gflowdist.runtime import protocol
from gflowdist.runtime.checkpoints import checkpoint_name
from gflowdist.runtime.protocol import Command, MessageType, command_of
from gflowdist.runtime.wiring import Wiring

__all__ = ["batch_size", "concat_batches", "run_trainer", "run_actor", "run_buffer", "send_final"]

log = logging.getLogger("gflowdist.runtime")

#: Test hook: ``GFLOWDIST_INJECT_GARBAGE=<rank>:<every>`` makes that producer send raw garbage
#: bytes on the data tag to its buffer after every ``every``-th batch (fault-injection tests).
INJECT_GARBAGE_VARIABLE = "GFLOWDIST_INJECT_GARBAGE"


def _garbage_plan(rank: int) -> int:
    spec = os.environ.get(INJECT_GARBAGE_VARIABLE, "")
    if not spec:
        return 0
    target, _, every = spec.partition(":")
    return int(every or 1) if int(target) == rank else 0


def batch_size(batch: Mapping[str, torch.Tensor]) -> int:
    """Number of trajectories in a batch (the leading dimension, equal for every field)."""
    sizes = {int(v.shape[0]) for v in batch.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(sizes) != 1:
        raise GflowdistError(f"a trajectory batch needs one leading batch dimension, found sizes {sorted(sizes)}")
    return sizes.pop()


def concat_batches(fresh: Mapping[str, torch.Tensor], replay: Mapping[str, torch.Tensor] | None) -> dict:
    """``fresh`` with ``replay`` appended along dimension 0; replayed tensors (received into host memory)
    move to the device of the fresh ones first."""
    if not replay:
        return dict(fresh)
    return {k: torch.cat([fresh[k], replay[k].to(fresh[k].device)]) if k in replay else fresh[k] for k in fresh}


def _send_trajectories(w: Wiring, batch: dict, seq: int, version: int, buffer: int) -> int:
    n = batch_size(batch)
    w.ledger.produced += n
    w.data.isend(*protocol.trajectories(batch, seq=seq, version=version, n=n), buffer)
    w.ledger.sent += n
    every = _garbage_plan(w.rank)
    if every and (w.ledger.sent // n) % every == 0:
        w.comm.isend(b"\x00not a gflowdist message" * 3, buffer, w.data.tag)
    return n


def _finish_client(w: Wiring, buffer: int | None) -> None:
    """Drain my sends, then tell my buffer I am done (after my last trajectory, same tag)."""
    if buffer is not None:
        w.data.send(*protocol.done(), buffer)
    w.data.drain()


def _send_weights(w: Wiring, trainer, actors, version: int) -> None:
    """My model's weights, stamped with its version, to each of my actors."""
    if not actors:
        return
    weights = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    for actor in actors:
        w.weights.isend(*protocol.weights(weights, version), actor)


def _reply_from(w: Wiring, buffer: int, timeout: float):
    """My buffer's answer to a sample request; a buffer that never answers is reported lost."""
    try:
        return w.data.recv(buffer, timeout=timeout)
    except DeadlineError as err:
        layout = w.context.layout
        raise PeerLostError(buffer, role=layout.role_of(buffer).value, host=layout.host_of(buffer),
                            reason=f"no reply to a sample request within {timeout:g} s") from err


def run_trainer(trainer, w: Wiring, state: dict, collector=None) -> dict:
    """The trainer loop; ``state`` holds step, version, seq (and is returned updated)."""
    from gflowdist.ops.averaging import average_gradients, average_models, sync_params

    cfg, timer = w.config, w.timer
    placement = w.context.placement
    buffer, actors = placement.buffer, placement.actors
    dp = w.context.comm("DP")
    replays = buffer is not None and cfg.replay.replay_fraction > 0
    staleness: Counter = state.setdefault("staleness", Counter())
    version, seq = state["version"], state["seq"]
    requested = 0  # sample requests sent and not yet answered (replies arrive in order)
    step = state["step"]
    if cfg.sync.mode != "none" and dp is not None and dp.size > 1:
        with timer.phase("sync"):  # replicas start from the same weights: the group's first trainer's
            sync_params(trainer.model, dp)
    _send_weights(w, trainer, actors, version)
    timeout = cfg.faults.peer_timeout_s
    while step < cfg.run.steps and not _group_stops(w, dp):
        with timer.phase("rollout"):
            fresh = trainer.rollout(version)
        if buffer is not None:
            with timer.phase("send"):
                seq += _send_trajectories(w, fresh, seq, version, buffer)
        else:
            n = batch_size(fresh)
            w.ledger.produced += n
            w.ledger.used_locally += n
            seq += n
        replay = None
        if replays:  # requests sent now ask for this step's share; with prefetch they serve later steps
            replay_n = cfg.replay.replayed_per_step(batch_size(fresh))
            if requested == 0 and cfg.replay.prefetch == 0:
                w.data.isend(*protocol.sample_request(replay_n, version), buffer)
                requested = 1
            if requested:
                with timer.phase("wait_replay"), timer.wait_on(buffer, "replay"):
                    reply = _reply_from(w, buffer, timeout)
                requested -= 1
                if reply.body.get("batch") is not None:
                    replay = reply.body["batch"]
                    staleness.update((version - reply.body["versions"]).tolist())
            while requested < cfg.replay.prefetch:  # keep `prefetch` requests ahead of use
                w.data.isend(*protocol.sample_request(replay_n, version), buffer)
                requested += 1
        batch = concat_batches(fresh, replay)
        with timer.phase("loss"):
            trainer.optimizer.zero_grad(set_to_none=True)
            loss = trainer.loss(batch)
            loss.backward()
        if cfg.sync.mode == "gradients" and dp is not None and dp.size > 1:
            with timer.phase("sync"):
                average_gradients(trainer.model, dp)
        with timer.phase("optimizer"):
            trainer.optimizer.step()
        version += 1
        if cfg.sync.mode == "models" and dp is not None and dp.size > 1 and version % cfg.sync.every == 0:
            with timer.phase("sync"):
                average_models(trainer.model, dp)
        if actors and version % cfg.sync.weights_to_actors_every == 0:
            _send_weights(w, trainer, actors, version)
        if step % cfg.run.log_every == 0 or step == cfg.run.steps - 1:
            metrics = {"step": step, "loss": float(loss.detach()), "trajectories": seq, **trainer.metrics()}
            if collector is not None:
                collector.record_metrics(w.rank, metrics)
            else:
                w.report(protocol.metrics(metrics))
        step += 1
        every = cfg.faults.checkpoint_every
        if every and step % every == 0 and step < cfg.run.steps:
            for _ in range(requested):  # no sample replies may be in flight across the cut
                _reply_from(w, buffer, timeout)
            requested = 0
            state.update(step=step, version=version, seq=seq)
            _checkpoint_cut(w, buffer, actors, checkpoint_name(w.generation, step), timeout)
        w.heartbeat(step)
        if collector is not None:
            collector.poll()
            collector.progress()
    for _ in range(requested):  # prefetched replies are read, not left on the wire
        _reply_from(w, buffer, timeout)
    for actor in actors:
        w.weights.isend(*protocol.stop(), actor)
    w.weights.drain()
    _finish_client(w, buffer)
    state.update(step=step, version=version, seq=seq)
    return state


def _group_stops(w: Wiring, dp) -> bool:
    """Whether to stop before this step, agreed by the whole agent group.

    A signal reaches the trainers of a group at slightly different times (on
    other hosts, through hydra's proxies); a trainer that stopped alone would
    leave its peers waiting in the next average forever. One MAX all-reduce
    of the stop flag per step makes them stop at the same step.
    """
    stop = w.check_control()
    if dp is None or dp.size == 1 or w.config.sync.mode == "none":
        return stop
    flag = torch.tensor([1.0 if stop else 0.0])
    dp.all_reduce(flag, op=ReduceOp.MAX)
    if flag.item() > 0 and not stop:
        w.stop.set("an agent-group peer stopped")
    return flag.item() > 0


def _checkpoint_cut(w: Wiring, buffer: int | None, actors, name: str, timeout: float) -> None:
    """A client's side of a periodic checkpoint: marker after my last trajectory, wait, save."""
    for actor in actors:
        w.weights.isend(*protocol.checkpoint(name), actor)
    if buffer is not None:
        w.data.send(*protocol.checkpoint(name), buffer)
        with w.timer.phase("checkpoint"), w.timer.wait_on(buffer, "checkpoint"):
            ack = _reply_from(w, buffer, timeout)
        if command_of(ack) is not Command.CHECKPOINTED or ack.body.get("name") != name:
            raise GflowdistError(f"expected the acknowledgement of checkpoint {name} from buffer rank "
                                 f"{buffer}, got a {ack.type.name} message")
    with w.timer.phase("checkpoint"):
        w.checkpoint(name)


def run_actor(actor, w: Wiring, state: dict) -> dict:
    """The actor loop: apply new weights, roll out, send; until my trainer says stop."""
    placement = w.context.placement
    trainer, buffer = placement.trainer, placement.buffer
    version, seq = state["version"], state["seq"]
    stopped = False
    while not stopped and not w.check_control():
        latest = None
        cuts = []
        msg = w.weights.try_recv(trainer)
        while msg is not None:
            command = command_of(msg)
            if command is Command.CHECKPOINT:
                cuts.append(msg.body["name"])
            elif command is Command.STOP:
                stopped = True
            elif msg.type is MessageType.WEIGHTS:
                latest = msg
            msg = w.weights.try_recv(trainer)
        if latest is not None:
            with w.timer.phase("load_weights"):
                actor.load_weights(latest.body["state"], latest.body["version"])
            version = latest.body["version"]
        for name in cuts:
            state.update(version=version, seq=seq)
            _checkpoint_cut(w, buffer, (), name, w.config.faults.peer_timeout_s)
        if stopped:
            break
        with w.timer.phase("rollout"):
            batch = actor.rollout(version)
        with w.timer.phase("send"):
            seq += _send_trajectories(w, batch, seq, version, buffer)
        w.heartbeat(seq)
    if not stopped:  # stopped by the coordinator: wait for my trainer's stop so no weights stay on the wire
        msg = None
        while msg is None or not protocol.is_command(msg, Command.STOP):
            msg = w.weights.recv(trainer, timeout=w.config.faults.peer_timeout_s)
    _finish_client(w, buffer)
    state.update(version=version, seq=seq)
    return state


def run_buffer(manager, w: Wiring, state: dict) -> dict:
    """Serve my clients' inserts and sample requests until every client said done."""
    cfg, ledger, timer = w.config, w.ledger, w.timer
    replay = state["replay"]
    clients = set(w.context.placement.clients)
    done: set[int] = set()
    marked: dict[str, set[int]] = {}  # periodic checkpoint name -> clients whose marker arrived
    latest_version = state.get("latest_version", 0)
    backoff = Backoff()
    last_summary = 0.0
    idle_s = 0.0
    while done != clients:
        try:
            msg = w.data.try_recv()
        except ProtocolError as err:  # counted and logged; the buffer keeps serving everyone else
            ledger.malformed[err.sender] += 1
            log.warning("%s", err)
            continue
        w.heartbeat(ledger.received, stored=len(replay))
        if msg is None:
            now = time.monotonic()
            if now - last_summary > max(cfg.faults.heartbeat_s, 0.5):
                last_summary = now
                w.report(protocol.summary(manager.summary()))
                w.check_control()
            paused = time.perf_counter()
            backoff.pause()
            idle_s += time.perf_counter() - paused  # one timer entry per idle stretch, not per poll
            continue
        if idle_s:
            timer.record("idle", idle_s)
            idle_s = 0.0
        backoff.reset()
        if msg.type is MessageType.TRAJECTORIES:
            with timer.phase("insert"):
                latest_version = max(latest_version, int(msg.body["version"]))
                _admit(manager, replay, w, msg, latest_version)
        elif msg.type is MessageType.SAMPLE_REQUEST:
            latest_version = max(latest_version, int(msg.body["version"]))
            with timer.phase("sample"):
                n = int(msg.body["n"])
                if replay.can_sample(n):
                    batch, info = replay.sample(n)
                    reply = protocol.sample_reply(batch, info["policy_version"])
                else:
                    reply = protocol.sample_reply(None)
                w.data.isend(*reply, msg.sender)
        elif command_of(msg) is Command.CHECKPOINT:
            marked.setdefault(msg.body["name"], set()).add(msg.sender)
        elif command_of(msg) is Command.DONE:
            done.add(msg.sender)
        for name in [n for n, senders in marked.items() if senders | done >= clients]:
            state["latest_version"] = latest_version
            with timer.phase("checkpoint"):
                w.checkpoint(name)  # every client is paused at the cut: my state is exactly theirs
            for client in sorted(marked.pop(name)):
                w.data.isend(*protocol.checkpointed(name), client)
    w.data.drain()
    w.report(protocol.summary(manager.summary()))
    state["latest_version"] = latest_version
    return state


def _admit(manager, replay, w: Wiring, msg, latest_version: int) -> None:
    from gflowdist.replay.buffer import RateLimitedError

    ledger, cfg = w.ledger, w.config
    n = int(msg.body["n"])
    ledger.received += n
    ledger.received_from[msg.sender] += n
    version = int(msg.body["version"])
    if cfg.replay.max_staleness is not None and latest_version - version > cfg.replay.max_staleness:
        ledger.drop("staleness", n)
        return
    batch = msg.body["batch"]
    try:
        result = replay.extend(batch, producer=msg.sender, seq=int(msg.body["seq"]), policy_version=version,
                               scores=manager.score(batch))
    except RateLimitedError:
        ledger.drop("rate_limit", n)
        return
    ledger.admitted += result.admitted
    ledger.drop("duplicate", result.rejected_duplicate)
    ledger.drop("low_score", result.rejected_low_score)
    ledger.evicted += result.evicted
    if result.admitted == n:  # all of it: the received batch itself, no masked copy of every field
        manager.on_admitted(batch)
    elif result.admitted:
        mask = result.admitted_mask
        manager.on_admitted({k: v[mask] for k, v in batch.items()})


def send_final(w: Wiring, role: str, extra: dict) -> dict:
    """My final report (ledger, timers, extra) to the collector; returns it."""
    final = {"role": role, "host": w.context.host, "ledger": w.ledger.to_dict(), "timing": w.timer.to_dict(),
             "channels": {"data": w.data.stats.to_dict(), "control": w.control.stats.to_dict()}, **extra}
    if w.rank != w.collector:
        w.control.send(*protocol.final_report(final), w.collector)
    w.control.drain()
    return final
