"""The base of samplers and writers: a named, checkpointable part of a buffer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gflowdist.errors import ConfigError

__all__ = ["Component"]


class Component:
    """A buffer part with a config spelling ``name``; its state dict records that name.

    ``kind`` is the config key it fills (``"sampler"`` or ``"writer"``), so
    loading another part's checkpoint names the key to fix.
    """

    kind: ClassVar[str] = "component"
    name: ClassVar[str] = "component"

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("name") != self.name:
            raise ConfigError(
                f"checkpoint was saved with {self.kind} {state.get('name')!r}, this buffer uses {self.name!r}",
                key=f"replay.{self.kind}",
            )
