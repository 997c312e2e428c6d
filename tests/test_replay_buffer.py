"""ReplayBuffer: every sampler x every writer, metadata, rate limiting, checkpoints, presets."""

from __future__ import annotations

import random
from types import SimpleNamespace

import msgpack
import pytest
import torch

from gflowdist.errors import ConfigError, DeadlineError
from gflowdist.replay import (
    DedupWriter,
    FifoSampler,
    KeepHighestWriter,
    PrioritizedSampler,
    RateLimitedError,
    RateLimiter,
    ReplayBuffer,
    RoundRobinWriter,
    TensorStorage,
    UniformSampler,
)

SAMPLERS = {"uniform": UniformSampler, "prioritized": lambda: PrioritizedSampler(0.8, 0.5), "fifo": FifoSampler}
WRITERS = {"round_robin": RoundRobinWriter, "keep_highest": KeepHighestWriter, "dedup": lambda: DedupWriter("terminal")}
CAPACITY = 12


def trajectories(seq: list[int], rng: random.Random) -> dict[str, torch.Tensor]:
    """HyperGrid-shaped items; ``tag`` repeats the seq so metadata alignment can be checked."""
    size = len(seq)
    terminal = torch.tensor([[rng.randrange(4), rng.randrange(4)] for _ in range(size)])
    return {
        "states": terminal.view(size, 1, 2).expand(size, 21, 2).clone(),
        "actions": torch.zeros(size, 20, dtype=torch.int64),
        "log_reward": torch.tensor([rng.random() for _ in range(size)]),
        "terminal": terminal,
        "tag": torch.tensor(seq),
    }


def make_buffer(sampler: str, writer: str, seed: int = 0, **kwargs) -> ReplayBuffer:
    return ReplayBuffer(
        TensorStorage(CAPACITY),
        SAMPLERS[sampler](),
        WRITERS[writer](),
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    )


def drive(buffer: ReplayBuffer, steps: int, rng: random.Random, next_seq: int = 0):
    """Random interleaving of extends and samples; yields ("extend", result) or ("sample", ...)."""
    for _ in range(steps):
        size = rng.randint(1, CAPACITY + 3)
        if (rng.random() < 0.6 or not buffer.can_sample(1)) and buffer.can_insert(size):
            seqs = list(range(next_seq, next_seq + size))
            next_seq += size
            batch = trajectories(seqs, rng)
            before = len(buffer)
            result = buffer.extend(
                batch, producer=rng.randrange(3), seq=seqs[0], policy_version=next_seq // 10, scores=batch["log_reward"]
            )
            yield "extend", (before, batch, result)
        else:
            n = rng.randint(1, 6)
            if buffer.can_sample(n):
                yield "sample", buffer.sample(n)


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_invariants_hold_for_every_combination(sampler, writer):
    rng = random.Random(f"{sampler}-{writer}")
    buffer = make_buffer(sampler, writer)
    served: list[int] = []
    for kind, payload in drive(buffer, 150, rng):
        if kind == "extend":
            before, batch, result = payload
            offered = batch["tag"].numel()
            assert result.offered == offered
            assert (result.admitted + result.rejected_duplicate + result.rejected_low_score) == offered
            assert len(buffer) == before + result.admitted - result.evicted
            assert 0 <= len(buffer) <= CAPACITY
            live = buffer.storage.live_indices()
            if writer == "dedup":
                keys = buffer.storage.get(live)["terminal"]
                assert torch.unique(keys, dim=0).shape[0] == keys.shape[0]
            else:
                assert result.rejected_duplicate == 0
            if writer != "keep_highest":
                assert result.rejected_low_score == 0
            stored = result.slots >= 0
            assert torch.equal(buffer.metadata["seq"][result.slots[stored]], batch["tag"][stored])
        else:
            batch, info = payload
            n = batch["tag"].numel()
            assert bool(((info["indices"] >= 0) & (info["indices"] < CAPACITY)).all())
            assert torch.equal(batch["tag"], info["seq"])  # metadata rows match item rows
            assert info["weights"].shape == (n,) and bool((info["weights"] <= 1).all())
            for name in ("producer", "policy_version", "score", "insert_step"):
                assert info[name].shape == (n,)
            if sampler == "fifo":
                assert info["insert_step"].tolist() == sorted(info["insert_step"].tolist())
                served.extend(info["seq"].tolist())
            if sampler == "prioritized":
                assert buffer.update_priorities(info["keys"], torch.rand(n) * 4) == n
    stats = buffer.stats()
    assert stats["sampled"] > 0
    assert stats["offered"] == (stats["admitted"] + stats["rejected_duplicate"] + stats["rejected_low_score"])
    assert stats["size"] == stats["admitted"] - stats["evicted"] - stats["consumed"]
    if sampler == "fifo":
        assert len(served) == len(set(served)) > 0  # each item served once


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_state_round_trip_gives_identical_subsequent_samples(sampler, writer):
    rng = random.Random(7)
    buffer = make_buffer(sampler, writer, seed=3)
    for _ in drive(buffer, 40, rng):
        pass
    if isinstance(buffer.sampler, PrioritizedSampler):
        live = buffer.storage.live_indices()
        buffer.sampler.update_priorities(live, torch.rand(live.numel(), generator=torch.Generator().manual_seed(1)))
    state = buffer.state_dict()
    restored = make_buffer(sampler, writer, seed=99)  # other seed: state carries the generator
    restored.load_state_dict(state)
    assert restored.stats() == buffer.stats()
    continuation = random.Random(11), random.Random(11)
    for (kind_a, a), (kind_b, b) in zip(
        drive(buffer, 30, continuation[0], 10_000), drive(restored, 30, continuation[1], 10_000), strict=False
    ):
        assert kind_a == kind_b
        if kind_a == "sample":
            for got, want in ((a[0], b[0]), (a[1], b[1])):
                assert got.keys() == want.keys()
                assert all(torch.equal(got[k], want[k]) for k in got)
        else:
            assert torch.equal(a[2].slots, b[2].slots) and a[2].evicted == b[2].evicted


def _encode_tensor(value):
    if isinstance(value, torch.Tensor):
        return msgpack.ExtType(
            1, msgpack.packb([str(value.dtype), list(value.shape), value.contiguous().numpy().tobytes()])
        )
    raise TypeError(f"unexpected {type(value).__name__} in a replay state dict")


def _decode_tensor(code, data):
    dtype_name, shape, raw = msgpack.unpackb(data)
    dtype = getattr(torch, dtype_name.removeprefix("torch."))
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape) if raw else torch.zeros(shape, dtype=dtype)


@pytest.mark.parametrize("sampler, writer", [("prioritized", "dedup"), ("fifo", "keep_highest")])
def test_state_dict_survives_msgpack_with_tensors_as_raw_bytes(sampler, writer):
    limiter = RateLimiter(min_size_to_sample=2, samples_per_insert=2.0, tolerance=40.0)
    buffer = make_buffer(sampler, writer, rate_limiter=limiter)
    for _ in drive(buffer, 20, random.Random(5)):
        pass
    wire = msgpack.packb(buffer.state_dict(), default=_encode_tensor)  # raises on non-plain
    restored = make_buffer(sampler, writer, rate_limiter=RateLimiter(2, 2.0, 40.0))
    restored.load_state_dict(msgpack.unpackb(wire, ext_hook=_decode_tensor, strict_map_key=False))
    assert restored.stats() == buffer.stats()
    n = min(2, len(buffer))
    if buffer.can_sample(n):
        assert torch.equal(buffer.sample(n)[0]["tag"], restored.sample(n)[0]["tag"])


def test_loading_into_a_differently_built_buffer_is_refused():
    state = make_buffer("uniform", "round_robin").state_dict()
    with pytest.raises(ConfigError, match="saved with sampler 'uniform'"):
        make_buffer("fifo", "round_robin").load_state_dict(state)
    with pytest.raises(ConfigError, match="rate limiter"):
        make_buffer("uniform", "round_robin", rate_limiter=RateLimiter(1)).load_state_dict(state)


def test_extend_stamps_metadata_and_seq_runs_consecutively():
    buffer = ReplayBuffer.uniform(8, generator=torch.Generator().manual_seed(0))
    batch = trajectories([0, 1, 2], random.Random(0))
    buffer.extend(batch, producer=4, seq=100, policy_version=torch.tensor([7, 8, 9]))
    assert buffer.metadata["seq"][:3].tolist() == [100, 101, 102]
    assert buffer.metadata["producer"][:3].tolist() == [4, 4, 4]
    assert buffer.metadata["policy_version"][:3].tolist() == [7, 8, 9]
    assert bool(torch.isnan(buffer.metadata["score"][:3]).all())
    assert buffer.metadata["insert_step"][:3].tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="producer has 2 entries for a batch of 3"):
        buffer.extend(batch, producer=torch.tensor([1, 2]), seq=0, policy_version=0)


def test_rate_limited_buffer_raises_and_tracks_size():
    limiter = RateLimiter(min_size_to_sample=4, samples_per_insert=1.0, tolerance=4.0)
    buffer = ReplayBuffer.fifo(6, rate_limiter=limiter)
    rng = random.Random(1)
    with pytest.raises(RateLimitedError, match="min_size_to_sample 4"):
        buffer.sample(1)
    buffer.extend(trajectories(list(range(8)), rng), producer=0, seq=0, policy_version=0)
    assert limiter.size == len(buffer) == 6  # two evicted in the call
    with pytest.raises(RateLimitedError, match="inserts would outrun samples"):
        buffer.extend(trajectories([8], rng), producer=0, seq=8, policy_version=0)
    buffer.sample(4)
    assert limiter.size == len(buffer) == 2  # FIFO consumed four


def test_wait_until_can_sample_makes_progress_or_hits_the_deadline():
    buffer = ReplayBuffer.fifo(8)
    rng = random.Random(2)
    with pytest.raises(DeadlineError, match="fifo sampler cannot serve 3 items from 0"):
        buffer.wait_until_can_sample(3, timeout=0.01)
    fed = []

    def feed() -> None:
        fed.append(1)
        buffer.extend(trajectories([len(fed)], rng), producer=0, seq=len(fed), policy_version=0)

    buffer.wait_until_can_sample(3, timeout=5.0, progress=feed)
    assert len(fed) == 3 and len(buffer) == 3


@pytest.mark.parametrize(
    "preset, sampler, writer",
    [
        (lambda: ReplayBuffer.uniform(5), UniformSampler, RoundRobinWriter),
        (lambda: ReplayBuffer.prioritized(5, 0.5, 0.5), PrioritizedSampler, RoundRobinWriter),
        (lambda: ReplayBuffer.fifo(5), FifoSampler, RoundRobinWriter),
        (lambda: ReplayBuffer.keep_highest(5), UniformSampler, KeepHighestWriter),
        (lambda: ReplayBuffer.dedup(5, "terminal"), UniformSampler, DedupWriter),
    ],
)
def test_presets_compose_the_documented_parts(preset, sampler, writer):
    buffer = preset()
    assert type(buffer.sampler) is sampler and type(buffer.writer) is writer
    assert buffer.capacity == 5 and buffer.rate_limiter is None


def replay_cfg(**overrides) -> SimpleNamespace:
    base = dict(
        capacity=16,
        sampler="uniform",
        writer="round_robin",
        min_size_to_sample=0,
        samples_per_insert=None,
        tolerance=0.0,
    )
    return SimpleNamespace(**{**base, **overrides})


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_from_config_builds_every_combination(sampler, writer):
    buffer = ReplayBuffer.from_config(
        replay_cfg(sampler=sampler, writer=writer, min_size_to_sample=2, samples_per_insert=2.0, tolerance=8.0),
        dedup_key="terminal",
    )
    assert buffer.sampler.name == sampler and buffer.writer.name == writer
    assert buffer.rate_limiter.window == (-4.0, 12.0)


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"sampler": "lifo"}, "replay.sampler: must be one of"),
        ({"writer": "dedup"}, "needs a key"),
        ({"writer": "newest"}, "replay.writer: must be one of"),
        ({"samples_per_insert": 1.0, "tolerance": 0.0}, "would block sample and/or insert"),
    ],
)
def test_from_config_rejects_impossible_settings(overrides, words):
    with pytest.raises(ConfigError, match=words):
        ReplayBuffer.from_config(replay_cfg(**overrides))


def test_from_config_accepts_the_real_replay_config():
    schema = pytest.importorskip("gflowdist.config.schema")
    config = getattr(schema, "ReplayConfig", None)
    if config is None:
        pytest.skip("gflowdist.config.schema has no ReplayConfig yet")
    buffer = ReplayBuffer.from_config(config())
    assert buffer.capacity > 0 and buffer.sampler.name and buffer.writer.name
