"""The configuration reference (docs/configuration.md) generated from the dataclasses.

``docs/configuration.md`` embeds the output of :func:`config_reference_markdown`
verbatim, and a test checks that it still does, so the page cannot drift from
the schema.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from gflowdist.config.sections import MIB, SECTIONS

__all__ = ["config_reference_markdown", "format_default"]


def format_default(value: Any) -> str:
    """A default as it would be written in YAML: ``null``, ``true``, ``"rest"``, ``[]``."""
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return "`[" + ", ".join(str(item) for item in value) + "]`"
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"`{value}` ({value // MIB} MiB)"
    return f"`{value}`"


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ")


def config_reference_markdown() -> str:
    """Markdown tables of every section: key, accepted values, default, meaning."""
    lines: list[str] = []
    for name, cls in SECTIONS.items():
        lines += [f"### `{name}`", "", _summary(cls), "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for spec in dataclasses.fields(cls):
            check = spec.metadata["check"]
            lines.append(
                f"| `{name}.{spec.name}` | {check.describe()} | "
                f"{format_default(spec.default)} | {spec.metadata['doc']} |"
            )
        lines.append("")
    lines += [
        "### `params`",
        "",
        "Free-form mapping with string keys, handed to the user's role classes as the "
        "read-only `self.params` (for example `ndim`, `height`, `lr`; lists read as "
        "tuples). Default: `{}`.",
        "",
    ]
    return "\n".join(lines)
