"""The runtime: role interfaces users subclass, their loops, the ledger, checkpoints, the job runner."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gflowdist.runtime.roles import Actor, BaseRole, BufferManager, Coordinator, Trainer

__all__ = ["Actor", "BaseRole", "BufferManager", "Coordinator", "Trainer"]


def __getattr__(name: str) -> Any:
    # the role classes load torch: on first access, so that the launcher can read gflowdist.runtime.settings light
    if name in __all__:
        from gflowdist.runtime import roles

        return getattr(roles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
