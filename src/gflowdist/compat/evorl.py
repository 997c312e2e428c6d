"""A torch analogue of EvoRL's ``evorl.distributed`` (JAX), over gflowdist.

EvoRL names its parallel axes; so does this module (see
:mod:`gflowdist.ops.axes`): ``"DP"`` is the data-parallel group (trainers of
one agent group), ``"POP"`` the population axis across agent groups, and
without groups both are the whole world. Where JAX maps a function over
devices, here each rank is one position on the axis.

- ``pmean / psum / pmax / pmin(x, axis_name=None)``: with ``axis_name=None``
  return ``x`` itself (as EvoRL); otherwise a new tensor reduced over the axis
  (``pmean``: ``(1/n) sum_r x_r`` with ``n`` the axis size).
- ``all_gather(x, axis_name=None, tiled=False)``: ``x`` itself for None; else
  a new leading axis in rank order, or concatenated along dim 0 when ``tiled``.
- ``gradient_update(loss_fn, optimizer, dp_axis_name)`` returns
  ``f(optimizer, module, *args) -> (loss, module, optimizer)``: zero grads,
  ``loss_fn(module, *args)``, backward, average gradients over the DP axis
  (none when it is None), step. With ``has_aux`` the loss function returns
  ``(loss, aux)`` and so does ``f`` in first place.
- ``shmap_map / shmap_vmap(fn, mesh=None, in_specs=None, out_specs=None)``:
  the population (dim 0 of the arguments) is split into contiguous shards,
  one per rank of the mesh (``P`` items over ``n`` ranks: the first
  ``P mod n`` ranks take ``ceil(P/n)``, the others ``floor(P/n)``); each rank
  runs ``fn`` on its items (one at a time for ``shmap_map``, batched with
  ``torch.func.vmap`` for ``shmap_vmap``) and every rank gets the whole
  result, gathered in population order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from gflowdist.comm.base import ReduceOp
from gflowdist.comm.native import Group
from gflowdist.ops.averaging import average_gradients
from gflowdist.ops.axes import DP_AXIS_NAME, POP_AXIS_NAME, axis_group
from gflowdist.ops.collectives import rank_and_size
from gflowdist.ops.trees import tree_leaves, tree_map

__all__ = [
    "DP_AXIS_NAME",
    "POP_AXIS_NAME",
    "pmean",
    "psum",
    "pmax",
    "pmin",
    "all_gather",
    "get_process_id",
    "get_global_ranks",
    "is_dist_initialized",
    "split_key_to_devices",
    "tree_device_put",
    "gradient_update",
    "agent_gradient_update",
    "shmap_map",
    "shmap_vmap",
]


def _reduce(x: Any, op: ReduceOp, axis_name: Any) -> Any:
    if axis_name is None:
        return x
    out = x.detach().clone() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x)).clone()
    return axis_group(axis_name).all_reduce(out, op)


def pmean(x: Any, axis_name: str | Group | None = None) -> Any:
    """Mean over the axis as a new tensor; ``x`` itself when ``axis_name`` is None."""
    return _reduce(x, ReduceOp.AVG, axis_name)


def psum(x: Any, axis_name: str | Group | None = None) -> Any:
    """Sum over the axis as a new tensor; ``x`` itself when ``axis_name`` is None."""
    return _reduce(x, ReduceOp.SUM, axis_name)


def pmax(x: Any, axis_name: str | Group | None = None) -> Any:
    """Element-wise max over the axis as a new tensor; ``x`` itself when ``axis_name`` is None."""
    return _reduce(x, ReduceOp.MAX, axis_name)


def pmin(x: Any, axis_name: str | Group | None = None) -> Any:
    """Element-wise min over the axis as a new tensor; ``x`` itself when ``axis_name`` is None."""
    return _reduce(x, ReduceOp.MIN, axis_name)


def all_gather(x: Any, axis_name: str | Group | None = None, tiled: bool = False) -> Any:
    """Every rank's ``x`` along a new leading axis (or concatenated on dim 0 when ``tiled``)."""
    if axis_name is None:
        return x
    parts = axis_group(axis_name).all_gather(x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(x))
    return torch.cat(parts) if tiled else torch.stack(parts)


def get_process_id(group: Group | None = None) -> int:
    """Rank of this process (0 alone)."""
    return rank_and_size(group)[0]


def get_global_ranks(group: Group | None = None) -> torch.Tensor:
    """``tensor([rank])``: the ranks of this process's devices (one per process here)."""
    return torch.tensor([get_process_id(group)])


def is_dist_initialized(group: Group | None = None) -> bool:
    """True only in a job of more than one process."""
    return rank_and_size(group)[1] > 1


def split_key_to_devices(seed: int, devices: Sequence[Any]) -> torch.Tensor:
    """``len(devices)`` distinct int64 seeds derived from ``seed``, identical on every rank.

    Seed ``i`` is the first 63 bits of ``SeedSequence(seed).spawn(len(devices))[i]``.
    """
    children = np.random.SeedSequence(int(seed)).spawn(len(devices))
    seeds = [int(child.generate_state(1, np.uint64)[0]) & ((1 << 63) - 1) for child in children]
    return torch.tensor(seeds, dtype=torch.int64)


def tree_device_put(tree: Any, device: Any) -> Any:
    """``leaf.to(device)`` for every tensor of a nested dict / list / tuple; the structure is kept."""
    return tree_map(lambda leaf: leaf.to(device) if isinstance(leaf, torch.Tensor) else leaf, tree)


def _split_loss(out: Any, has_aux: bool) -> tuple[torch.Tensor, Any]:
    if has_aux:
        loss, aux = out
        return loss, (loss.detach(), aux)
    return out, out.detach()


def gradient_update(
    loss_fn: Callable[..., Any],
    optimizer: torch.optim.Optimizer,
    dp_axis_name: str | Group | None,
    has_aux: bool = False,
) -> Callable[..., tuple]:
    """``f(optimizer, module, *args) -> (loss value, module, optimizer)`` taking one averaged step.

    ``optimizer`` given here is used when ``f`` is called with ``None``.
    """
    default_optimizer = optimizer

    def f(opt: torch.optim.Optimizer | None, module: torch.nn.Module, *args: Any, **kwargs: Any) -> tuple:
        opt = default_optimizer if opt is None else opt
        opt.zero_grad()
        loss, value = _split_loss(loss_fn(module, *args, **kwargs), has_aux)
        loss.backward()
        if dp_axis_name is not None:
            average_gradients(module, axis_group(dp_axis_name))
        opt.step()
        return value, module, opt

    return f


def _attach_params_to_agent_state(agent_state: Any, params: torch.nn.Module) -> Any:
    if dataclasses.is_dataclass(agent_state) and not isinstance(agent_state, type):
        return dataclasses.replace(agent_state, params=params)
    if hasattr(agent_state, "replace"):
        return agent_state.replace(params=params)
    if isinstance(agent_state, Mapping):
        return {**agent_state, "params": params}
    raise TypeError(f"cannot attach params to a {type(agent_state).__name__}: pass attach_fn")


def _detach_params_from_agent_state(agent_state: Any) -> torch.nn.Module:
    if isinstance(agent_state, Mapping):
        return agent_state["params"]
    return agent_state.params


def agent_gradient_update(
    loss_fn: Callable[..., Any],
    optimizer: torch.optim.Optimizer,
    dp_axis_name: str | Group | None = None,
    has_aux: bool = False,
    attach_fn: Callable[[Any, torch.nn.Module], Any] = _attach_params_to_agent_state,
    detach_fn: Callable[[Any], torch.nn.Module] = _detach_params_from_agent_state,
) -> Callable[..., tuple]:
    """:func:`gradient_update` for an agent state holding the module (``detach_fn(state)``).

    Returns ``f(optimizer, agent_state, sample_batch, key) -> (loss value, agent_state, optimizer)``;
    ``loss_fn(agent_state, sample_batch, key)`` sees the state with the module attached.
    """

    def module_loss(module: torch.nn.Module, agent_state: Any, *args: Any, **kwargs: Any) -> Any:
        return loss_fn(attach_fn(agent_state, module), *args, **kwargs)

    update = gradient_update(module_loss, optimizer, dp_axis_name, has_aux)

    def f(opt: torch.optim.Optimizer | None, agent_state: Any, *args: Any, **kwargs: Any) -> tuple:
        value, module, opt = update(opt, detach_fn(agent_state), agent_state, *args, **kwargs)
        return value, attach_fn(agent_state, module), opt

    return f


def _shard_bounds(population: int, size: int, rank: int) -> tuple[int, int]:
    base, extra = divmod(population, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _population_map(
    fn: Callable[..., Any], mesh: Any, in_specs: Any, out_specs: Any, batched: bool
) -> Callable[..., Any]:
    if out_specs is not None:
        raise ValueError("out_specs: the result is always the whole population gathered along dim 0; pass None")

    def run(*args: Any) -> Any:
        comm = axis_group(POP_AXIS_NAME) if mesh is None else axis_group(mesh)
        specs = (
            [True] * len(args) if in_specs is None else [spec is not None and spec is not False for spec in in_specs]
        )
        if len(specs) != len(args):
            raise ValueError(f"in_specs has {len(specs)} entries for {len(args)} arguments")
        sizes = {int(a.shape[0]) for a, sharded in zip(args, specs, strict=False) if sharded}
        if len(sizes) != 1:
            raise ValueError(f"sharded arguments must share their leading (population) size, got {sorted(sizes)}")
        population = sizes.pop()
        check = torch.tensor([population, -population], dtype=torch.int64)
        comm.all_reduce(check, ReduceOp.MAX)
        if int(check[0]) != population or -int(check[1]) != population:
            raise ValueError(f"ranks disagree on the population size ({-int(check[1])}..{int(check[0])})")
        if population < comm.size:
            raise ValueError(f"a population of {population} cannot give each of {comm.size} ranks a shard")
        start, stop = _shard_bounds(population, comm.size, comm.rank)
        local = [a[start:stop] if sharded else a for a, sharded in zip(args, specs, strict=False)]
        if batched:
            dims = tuple(0 if sharded else None for sharded in specs)
            out = torch.func.vmap(fn, in_dims=dims)(*local)
        else:
            items = [
                fn(*[a[i] if sharded else a for a, sharded in zip(local, specs, strict=False)])
                for i in range(stop - start)
            ]
            rows = [tree_leaves(item) for item in items]
            columns = iter([torch.stack([torch.as_tensor(row[k]) for row in rows]) for k in range(len(rows[0]))])
            out = tree_map(lambda _: next(columns), items[0])
        longest = _shard_bounds(population, comm.size, 0)[1]
        bounds = [_shard_bounds(population, comm.size, r) for r in range(comm.size)]

        def gather(leaf: torch.Tensor) -> torch.Tensor:
            padded = leaf.new_zeros((longest, *tuple(leaf.shape[1:])))
            padded[: leaf.shape[0]] = leaf
            parts = comm.all_gather(padded)
            return torch.cat([part[: b - a] for part, (a, b) in zip(parts, bounds, strict=False)])

        return tree_map(gather, out)

    return run


def shmap_map(
    fn: Callable[..., Any], mesh: Any = None, in_specs: Any = None, out_specs: Any = None
) -> Callable[..., Any]:
    """Run ``fn`` on each member of the population, sharded over the mesh's ranks (see module docstring).

    ``mesh``: an axis name, a communicator or a native group (None: the POP axis).
    ``in_specs``: one entry per argument; None / False marks an argument
    passed whole to every call instead of being split along dim 0.
    """
    return _population_map(fn, mesh, in_specs, out_specs, batched=False)


def shmap_vmap(
    fn: Callable[..., Any], mesh: Any = None, in_specs: Any = None, out_specs: Any = None
) -> Callable[..., Any]:
    """As :func:`shmap_map`, but each rank runs ``torch.func.vmap(fn)`` over its whole shard at once."""
    return _population_map(fn, mesh, in_specs, out_specs, batched=True)
