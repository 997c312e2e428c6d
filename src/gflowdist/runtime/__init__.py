"""The runtime: role interfaces users subclass, their loops, the ledger, checkpoints, the job runner."""

from gflowdist.runtime.roles import Actor, BufferManager, Coordinator, Role, Trainer

__all__ = ["Actor", "BufferManager", "Coordinator", "Role", "Trainer"]
