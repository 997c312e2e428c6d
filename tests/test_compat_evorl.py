"""gflowdist.compat.evorl in one process (a world of one)."""

from __future__ import annotations

import dataclasses
from collections import namedtuple

import pytest
import torch

from gflowdist.compat import evorl
from gflowdist.errors import ConfigError


def test_axis_none_is_identity_and_named_axes_reduce():
    x = torch.tensor([1.0, 2.0])
    for fn in (evorl.pmean, evorl.psum, evorl.pmax, evorl.pmin, evorl.all_gather):
        assert fn(x) is x
    out = evorl.pmean(x, evorl.DP_AXIS_NAME)
    assert out is not x and out.tolist() == [1.0, 2.0]
    assert evorl.all_gather(x, evorl.POP_AXIS_NAME).shape == (1, 2)
    assert evorl.all_gather(x, evorl.POP_AXIS_NAME, tiled=True).tolist() == [1.0, 2.0]
    with pytest.raises(TypeError):
        evorl.pmean(torch.tensor([1, 2]), "DP")


def test_unknown_axis_raises():
    with pytest.raises(ConfigError, match="unknown axis"):
        evorl.psum(torch.ones(1), "TIME")


def test_identity_functions():
    assert evorl.DP_AXIS_NAME == "DP" and evorl.POP_AXIS_NAME == "POP"
    assert evorl.get_process_id() == 0
    assert evorl.get_global_ranks().tolist() == [0]
    assert evorl.is_dist_initialized() is False


def test_split_key_to_devices():
    keys = evorl.split_key_to_devices(7, ["a", "b", "c", "d"])
    assert keys.dtype == torch.int64 and len(set(keys.tolist())) == 4
    assert torch.equal(keys, evorl.split_key_to_devices(7, range(4)))
    assert not torch.equal(keys, evorl.split_key_to_devices(8, range(4)))


def test_tree_device_put_keeps_containers():
    Pair = namedtuple("Pair", "left right")
    tree = {"p": Pair(torch.ones(1), [torch.zeros(2)]), "n": 3}
    moved = evorl.tree_device_put(tree, torch.device("cpu"))
    assert isinstance(moved["p"], Pair) and isinstance(moved["p"].right, list) and moved["n"] == 3
    assert moved["p"].left.device.type == "cpu"


def test_gradient_update_has_aux_and_default_optimizer():
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(2.0)
    opt = torch.optim.SGD(module.parameters(), lr=0.25)

    def loss_fn(m, x):
        loss = (m.weight * x).sum()
        return loss, {"x": x}

    update = evorl.gradient_update(loss_fn, opt, None, has_aux=True)
    (loss, aux), same_module, same_opt = update(None, module, 4.0)
    assert float(loss) == 8.0 and aux == {"x": 4.0}
    assert same_module is module and same_opt is opt
    assert float(module.weight.detach()) == pytest.approx(2.0 - 0.25 * 4.0)


@dataclasses.dataclass(frozen=True)
class AgentState:
    params: torch.nn.Module
    step: int


def test_agent_gradient_update_with_a_dataclass_state():
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.zero_()
    opt = torch.optim.SGD(module.parameters(), lr=1.0)
    seen = []

    def loss_fn(state, batch, key):
        seen.append((type(state).__name__, key))
        return (state.params.weight * batch).sum()

    update = evorl.agent_gradient_update(loss_fn, opt, "DP")
    value, state, _ = update(opt, AgentState(module, 3), torch.tensor([2.0]), 11)
    assert float(value) == 0.0 and seen == [("AgentState", 11)]
    assert isinstance(state, AgentState) and state.params is module and state.step == 3
    assert float(module.weight.detach()) == -2.0


@pytest.mark.parametrize("runner", [evorl.shmap_map, evorl.shmap_vmap])
def test_shmap_world_of_one(runner):
    run = runner(lambda x: {"double": 2 * x, "sum": x.sum()})
    out = run(torch.arange(6.0).reshape(3, 2))
    assert out["double"].tolist() == [[0, 2], [4, 6], [8, 10]] and out["sum"].tolist() == [1, 5, 9]


def test_shmap_rejects_out_specs_and_mismatched_sizes():
    with pytest.raises(ValueError, match="out_specs"):
        evorl.shmap_map(lambda x: x, out_specs=("POP",))
    with pytest.raises(ValueError, match="leading"):
        evorl.shmap_map(lambda a, b: a + b)(torch.ones(3), torch.ones(4))
