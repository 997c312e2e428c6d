"""The runtime: role interfaces users subclass, their loops, the ledger, checkpoints, the job runner."""

from gflowdist.runtime.roles import Actor, BaseRole, BufferManager, Coordinator, Trainer

__all__ = ["Actor", "BaseRole", "BufferManager", "Coordinator", "Trainer"]
