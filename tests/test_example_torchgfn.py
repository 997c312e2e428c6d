"""examples/torchgfn_hypergrid: torchgfn's HyperGrid GFlowNet as a gflowdist job.

In one process: the wire batch (trajectory_wire.py) carries torchgfn
``Trajectories`` through gflowdist's codec and back without changing
torchgfn's trajectory-balance loss, fresh and replayed batches concatenate,
malformed batches are refused, and the buffer role scores and tracks modes
with torchgfn's environment. End to end: ``gflowdist run`` of the example on
4 ranks balances its ledger, lowers the TB loss, moves log Z towards
torchgfn's exact log partition and keeps the two trainers' models equal.

torchgfn is an optional extra; without it this module is skipped (reported
by ``-ra``), never passed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("gfn", reason="torchgfn is an optional extra: pip install 'torchgfn==2.4.1'")

from gfn.containers import Trajectories

from gflowdist.errors import GflowdistError
from gflowdist.transport import EncodeError, MessageType, decode, encode
from tests.support.jobs import read_json
from tests.support.launching import REPO
from tests.support.scripts import load_script

EXAMPLE = REPO / "examples" / "torchgfn_hypergrid"
CONFIG = EXAMPLE / "config.yaml"


roles = load_script(EXAMPLE / "roles.py", "torchgfn_example_roles")
wire = load_script(EXAMPLE / "trajectory_wire.py")  # the module roles.py imported

PARAMS = {"ndim": 2, "height": 8, "hidden": 32, "layers": 2}


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    env = roles.make_env(PARAMS)
    gflownet = roles.make_gflownet(env, PARAMS)
    sampler = roles.Sampler(estimator=gflownet.pf)
    return env, gflownet, sampler, roles.max_length(env)


def sample(setup, n: int, epsilon: float = 0.5) -> Trajectories:
    env, _, sampler, _ = setup
    with torch.no_grad():
        return sampler.sample_trajectories(env, n=n, epsilon=epsilon)


def test_batch_holds_torchgfn_trajectories_batch_first_and_padded(setup):
    env, _, _, T = setup
    sampled = sample(setup, 64)
    trajectories = sampled[sampled.terminating_idx < T - 1]  # torchgfn trims to the longest kept
    assert trajectories.max_length < T - 1  # so the padding below is exercised
    batch = wire.trajectories_to_batch(trajectories, T)
    n, D = len(trajectories), env.ndim
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "states": (n, T + 1, D),
        "actions": (n, T, 1),
        "terminating_idx": (n,),
        "log_rewards": (n,),
        "terminal": (n, D),
    }
    states, actions = trajectories.states.tensor, trajectories.actions.tensor
    for i in range(n):
        L = int(batch["terminating_idx"][i])
        assert torch.equal(batch["states"][i, :L], states[:L, i])
        assert (batch["states"][i, L:] == env.sf).all()  # torchgfn's sink, then the same as padding
        assert torch.equal(batch["actions"][i, :L], actions[:L, i])
        assert torch.equal(batch["actions"][i, L - 1], env.exit_action)
        assert (batch["actions"][i, L:] == env.dummy_action).all()
        assert torch.equal(batch["terminal"][i], batch["states"][i, L - 1])
    assert torch.equal(batch["log_rewards"], env.log_reward(env.states_from_tensor(batch["terminal"])))


def test_round_trip_through_the_codec_keeps_torchgfn_tb_loss(setup):
    env, gflownet, _, T = setup
    trajectories = sample(setup, 24)
    batch = wire.trajectories_to_batch(trajectories, T)
    message = decode(encode(MessageType.TRAJECTORIES, {"batch": batch}, sender=0, seq=0), sender=0)
    received = message.body["batch"]
    assert all(torch.equal(received[k], batch[k]) for k in wire.BATCH_KEYS)
    rebuilt = wire.batch_to_trajectories(env, received)
    assert torch.allclose(
        gflownet.loss(env, rebuilt, reduction="none"), gflownet.loss(env, trajectories, reduction="none")
    )


def test_torchgfn_objects_do_not_cross_the_wire(setup):
    trajectories = sample(setup, 4)
    with pytest.raises(EncodeError):
        encode(MessageType.TRAJECTORIES, {"batch": trajectories}, sender=0, seq=0)


def test_fresh_and_replayed_batches_concatenate(setup):
    """Batches of different torchgfn lengths share T, so the runtime's torch.cat works;
    the mean loss of the union is the mean of the two equal-sized batches' losses."""
    env, gflownet, _, T = setup
    short = sample(setup, 16, epsilon=0.0)
    long = sample(setup, 16, epsilon=0.9)
    a, b = wire.trajectories_to_batch(short, T), wire.trajectories_to_batch(long, T)
    both = {k: torch.cat([a[k], b[k]]) for k in a}
    loss = gflownet.loss(env, wire.batch_to_trajectories(env, both))
    halves = [gflownet.loss(env, wire.batch_to_trajectories(env, x)) for x in (a, b)]
    assert torch.allclose(loss, (halves[0] + halves[1]) / 2)


def _damaged(batch: dict, how: str) -> dict:
    bad = dict(batch)
    if how == "missing key":
        del bad["terminal"]
    elif how == "extra key":
        bad["log_probs"] = torch.zeros(batch["actions"].shape[:2])
    elif how == "zero length":
        bad["terminating_idx"] = batch["terminating_idx"].clone()
        bad["terminating_idx"][0] = 0
    elif how == "length beyond T":
        bad["terminating_idx"] = batch["terminating_idx"].clone()
        bad["terminating_idx"][0] = batch["actions"].shape[1] + 1
    elif how == "short actions":
        bad["actions"] = batch["actions"][:, :-1]
    elif how == "wrong state shape":
        bad["states"] = batch["states"][..., :1]
    elif how == "float lengths":
        bad["terminating_idx"] = batch["terminating_idx"].float()
    elif how == "not a tensor":
        bad["log_rewards"] = batch["log_rewards"].tolist()
    return bad


@pytest.mark.parametrize(
    "how",
    [
        "missing key",
        "extra key",
        "zero length",
        "length beyond T",
        "short actions",
        "wrong state shape",
        "float lengths",
        "not a tensor",
    ],
)
def test_malformed_batches_are_refused(setup, how):
    env, _, _, T = setup
    batch = wire.trajectories_to_batch(sample(setup, 8), T)
    with pytest.raises(GflowdistError):
        wire.batch_to_trajectories(env, _damaged(batch, how))


def test_a_trajectory_longer_than_max_length_is_refused(setup):
    trajectories = sample(setup, 16, epsilon=0.9)
    with pytest.raises(GflowdistError, match="longer than max_length"):
        wire.trajectories_to_batch(trajectories, trajectories.max_length - 1)


def test_buffer_scores_novelty_and_tracks_torchgfn_modes(setup):
    env, _, _, T = setup
    buffer = roles.TorchgfnHyperGridBuffer(rank=0, config=SimpleNamespace(params=PARAMS), generator=torch.Generator())
    buffer.setup()
    batch = wire.trajectories_to_batch(sample(setup, 64, epsilon=0.9), T)
    bonus = buffer.novelty_bonus
    assert torch.allclose(buffer.score(batch), batch["log_rewards"] + bonus)  # nothing seen yet
    buffer.on_admitted(batch)
    assert torch.allclose(buffer.score(batch), batch["log_rewards"])  # all seen now
    indices = env.get_states_indices(batch["terminal"])
    mode = env.mode_mask(env.states_from_tensor(batch["terminal"]))
    summary = buffer.summary()
    assert summary["visited"] == len(set(indices.tolist()))
    assert summary["modes"] == sorted(set(indices[mode].tolist()))


def test_all_states_and_true_distribution_follow_torchgfn(setup):
    """Canonical order as torchgfn's all_indices(); on 8x8 the outer ring has coordinates
    {0,1,6,7} and the band {1,6}, so Z = 64*R0 + 16*R1 + 4*R2 = 22.4 and there are 4 modes."""
    env = setup[0]
    states = roles.all_states(env)
    assert states.tensor.tolist() == [list(x) for x in env.all_indices()]
    assert torch.equal(env.get_states_indices(states), torch.arange(env.n_states))
    rewards = env.reward(states).double()
    assert math.isclose(float(rewards.sum()), 64 * 0.1 + 16 * 0.5 + 4 * 2.0, rel_tol=1e-6)
    assert torch.allclose(roles.true_distribution(env), rewards / rewards.sum())
    assert env.modes_found(states) == {1 * 8 + 1, 1 * 8 + 6, 6 * 8 + 1, 6 * 8 + 6}


def test_without_torchgfn_the_roles_name_the_package_to_install():
    """A fresh interpreter where ``import gfn`` fails, as if torchgfn were not installed."""
    code = (
        "import sys; sys.modules['gfn'] = None\n"
        "from gflowdist.config.classes import load_class\n"
        f"load_class({str(EXAMPLE / 'roles.py')!r} + ':TorchgfnHyperGridTrainer', key='roles.trainer')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("gflowdist.errors.ConfigError: roles.trainer:"), result.stderr
    assert "needs torchgfn" in last and "pip install 'torchgfn==2.4.1'" in last


STEPS, LOG_EVERY, PER_STEP = 60, 5, 16


@pytest.mark.slow
def test_the_example_runs_on_four_ranks(job_factory):
    job = job_factory(f"run.steps={STEPS}", f"run.log_every={LOG_EVERY}", config=CONFIG)
    assert job.wait(240) == 0, job.output
    run = job.run_dir()
    ledger = read_json(run / "ledger.json")
    assert ledger["balanced"], ledger
    assert ledger["totals"]["produced"] == ledger["totals"]["admitted"] == STEPS * PER_STEP * 2
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trainers = sorted({m["rank"] for m in metrics})
    assert trainers == [0, 1]
    steps = sorted({m["step"] for m in metrics})
    first = [m["loss"] for m in metrics if m["step"] == steps[0]]
    last = [m["loss"] for m in metrics if m["step"] in steps[-3:]]
    assert sum(last) / len(last) < sum(first) / len(first), (first, last)
    # log Z starts at 0 and moves towards the exact log partition
    env = roles.make_env(PARAMS)
    log_partition = math.log(float(env.reward(roles.all_states(env)).double().sum()))
    final_log_z = [m["log_z"] for m in metrics if m["step"] == steps[-1]]
    assert all(abs(z - log_partition) < abs(0.0 - log_partition) for z in final_log_z)
    # data-parallel replicas: same initial weights + the same averaged gradients = the same models
    final = run / "checkpoints" / "gen-0000-final"
    models = [torch.load(final / f"rank-{r:05d}.pt", weights_only=True)["role"]["model"] for r in trainers]
    assert models[0].keys() == models[1].keys()
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    finals = read_json(run / "finals.json")
    coordinator = next(f for f in finals.values() if f["role"] == "coordinator")["summary"]
    buffer = next(f for f in finals.values() if f["role"] == "buffer")["summary"]
    true_modes = env.modes_found(roles.all_states(env))
    assert coordinator["modes_total"] == len(true_modes)
    assert coordinator["modes_found"] == len(buffer["modes"]) >= 1
    assert set(buffer["modes"]) <= true_modes
    assert not math.isnan(sum(m["loss"] for m in metrics))
    assert job.no_process_left()
