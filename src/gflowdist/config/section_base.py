"""What every configuration section is made of: :func:`setting` fields and the :class:`Section` mixin that
checks them when a section is constructed (the sections themselves: :mod:`gflowdist.config.sections`)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, ClassVar

from gflowdist.config.checks import (
    Check,
    CountCheck,
)
from gflowdist.errors import ConfigError

__all__ = ["Section", "setting", "REST", "MIB"]

REST = CountCheck.REST
"""The count ``"rest"``: whatever ranks the other roles leave."""

MIB = 1024 * 1024


def setting(default: Any, check: Check, doc: str) -> Any:
    """A section field: its default, the check its values pass, and one line of documentation."""
    return field(default=default, metadata={"check": check, "doc": doc})


class Section:
    """Mixin of every section: run the field checks, then the cross-field checks."""

    section: ClassVar[str] = ""
    #: Keys a section no longer has -> what to write instead (said instead of "unknown key").
    removed: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]
            check = spec.metadata.get("check")
            if check is None:
                continue
            try:
                value = check(getattr(self, spec.name))
            except ConfigError as err:
                raise ConfigError(err.detail, key=f"{self.section}.{spec.name}") from None
            object.__setattr__(self, spec.name, value)
        self.check_together()

    def check_together(self) -> None:
        """Checks that involve several fields of the section (override in a section)."""

    def fail(self, name: str, message: str) -> ConfigError:
        return ConfigError(message, key=f"{self.section}.{name}")

    def to_dict(self) -> dict[str, Any]:
        """Plain values: tuples become lists, so the result is YAML/JSON-ready."""
        out: dict[str, Any] = {}
        for spec in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, spec.name)
            out[spec.name] = list(value) if isinstance(value, tuple) else value
        return out
