"""The worked examples in docs/layout.md are real `Layout.describe()` output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gflowdist.layout import parse_host_list, plan_layout

DOC = Path(__file__).resolve().parents[1] / "docs" / "layout.md"
EXAMPLE = re.compile(r"<!-- plan: (\d+) (\{.*?\})(?: hosts=(\S+))? -->\n```text\n(.*?)\n```", re.S)


def examples() -> list[tuple[int, dict, str | None, str]]:
    found = [(int(w), json.loads(cfg), hosts, table) for w, cfg, hosts, table in EXAMPLE.findall(DOC.read_text())]
    return found


def test_doc_has_examples() -> None:
    assert len(examples()) >= 5


@pytest.mark.parametrize("world, layout_cfg, hosts, table", examples())
def test_example_matches_plan_layout(world: int, layout_cfg: dict, hosts: str | None, table: str) -> None:
    layout = plan_layout(world, layout_cfg, parse_host_list(hosts) if hosts else None)
    assert layout.describe() == table
