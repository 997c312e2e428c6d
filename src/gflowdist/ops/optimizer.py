"""An optimizer wrapper whose ``step()`` averages gradients across a group first.

    opt = DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    loss.backward()
    opt.step()          # = average_gradients over the group, then Adam's step

Construction broadcasts the parameters from the group's first rank (a
collective; pass ``sync_params=False`` when they are already identical).
From then on every rank applies the same update to the same parameters with
the same averaged gradients, so the parameters stay identical across ranks.
This is the torch counterpart of Spinning Up's ``MpiAdamOptimizer`` (which
averages flat gradients with one ``Allreduce``), for any torch optimizer.

The wrapper *is* a ``torch.optim.Optimizer`` sharing the wrapped one's
``param_groups`` and ``state`` (learning-rate schedulers work on it);
``state_dict``, ``load_state_dict``, ``zero_grad`` and ``add_param_group``
act on the wrapped optimizer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from gflowdist.comm.native import Group
from gflowdist.ops.averaging import GradientAverager
from gflowdist.ops.averaging import sync_params as broadcast_params
from gflowdist.ops.buckets import DEFAULT_BUCKET_CAP_BYTES
from gflowdist.ops.collectives import group_or_world

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer(torch.optim.Optimizer):
    """Wrap ``optimizer`` so ``step()`` averages gradients over ``group`` (None: the world)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        group: Group | None = None,
        *,
        sync_params: bool = True,
        bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    ):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, not {type(optimizer).__name__}")
        # Optimizer.__init__ is not called on purpose: this object shares the
        # wrapped optimizer's param_groups, state and defaults instead of copying them.
        self.optimizer = optimizer
        self.group = group_or_world(group)
        self.bucket_cap_bytes = bucket_cap_bytes
        self.defaults = optimizer.defaults
        self._averager = GradientAverager(self._params(), self.group, bucket_cap_bytes=bucket_cap_bytes)
        if sync_params:
            broadcast_params(self._params(), self.group)

    # the wrapped optimizer's state, shared (schedulers and hooks read these)
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, value) -> None:
        self.optimizer.state = value

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def average_gradients(self) -> None:
        """Average the gradients of every parameter of the optimizer over the group (a collective)."""
        params = self._params()
        if not self._averager.matches(params, self.group):  # add_param_group since last time
            self._averager = GradientAverager(params, self.group, bucket_cap_bytes=self.bucket_cap_bytes)
        self._averager()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Average gradients over the group, then step the wrapped optimizer.

        With a ``closure``, the gradients it produces are averaged each time
        the wrapped optimizer evaluates it (LBFGS evaluates it several times).
        """
        if closure is None:
            self.average_gradients()
            return self.optimizer.step()

        def averaged_closure() -> Any:
            loss = closure()
            self.average_gradients()
            return loss

        return self.optimizer.step(averaged_closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, group={self.group!r})"

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("DistributedOptimizer holds a communicator; save optimizer.state_dict() instead")
