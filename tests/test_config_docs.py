"""docs/configuration.md embeds the generated reference, so it cannot drift from the schema."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gflowdist.config import SECTIONS, config_reference_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_doc_contains_the_generated_reference() -> None:
    assert config_reference_markdown() in DOC.read_text(), (
        "docs/configuration.md is out of date: paste the output of "
        "gflowdist.config.config_reference_markdown() under '## Reference'"
    )


def test_reference_lists_every_key_with_its_default() -> None:
    text = config_reference_markdown()
    for name, cls in SECTIONS.items():
        for spec in dataclasses.fields(cls):
            row = next(line for line in text.splitlines() if line.startswith(f"| `{name}.{spec.name}` |"))
            assert spec.metadata["doc"] in row
    assert "### `params`" in text
    assert '| `layout.trainers` | int >= 0 \\| "rest" | `"rest"` |' in text
    assert "`268435456` (256 MiB)" in text
