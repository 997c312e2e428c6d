"""Every config the documentation shows loads, and ``params`` cannot be changed through any path.

A config block is a fenced code block (any language tag) of docs/, the README
or an example's README whose YAML is a mapping with a gflowdist section
(``run``, ``layout``, ...) at its top: all of its top-level keys must be
sections and it must load with :meth:`Config.from_dict` (role references
are not imported: they name the reader's files). The schema's docstring
example is one too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from gflowdist.config import SECTIONS, Config, FrozenMapping
from gflowdist.config import schema as schema_module
from gflowdist.runtime import BufferManager

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = {*SECTIONS, "params"}
PAGES = [
    *sorted((REPO / "docs").rglob("*.md")),
    REPO / "README.md",
    *sorted((REPO / "examples").rglob("*.md")),
    *sorted((REPO / "docker").rglob("*.md")),
]


def config_blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for number, block in enumerate(re.findall(r"```[\w-]*\n(.*?)```", page.read_text(), re.S)):
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError:
                continue
            if isinstance(data, dict) and TOP_LEVEL & {str(key) for key in data}:
                found.append((f"{page.relative_to(REPO)}#{number}", block))
    docstring = schema_module.__doc__.split("A full file (every section optional, every key optional)::", 1)[1]
    found.append(("gflowdist/config/schema.py docstring", "\n".join(line[4:] for line in docstring.splitlines())))
    return found


BLOCKS = config_blocks()


def test_the_configuration_page_the_quick_start_and_the_readme_have_config_blocks():
    where = {name.split("#")[0] for name, _ in BLOCKS}
    assert {"docs/configuration.md", "docs/quickstart.md", "README.md"} <= where


@pytest.mark.parametrize("name, block", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_every_config_block_loads(name, block):
    data = yaml.safe_load(block)
    assert {str(key) for key in data} <= TOP_LEVEL, f"{name}: not a config, or a misspelt section"
    Config.from_dict(data, file=name)


def test_params_are_read_only_all_the_way_down_and_roles_get_the_same_object():
    config = Config.from_dict(
        {"roles": {"trainer": "x.py:T"}, "params": {"model": {"hidden": 64}, "sizes": [1, 2], "lr": 0.1}}
    )
    with pytest.raises(TypeError):
        config.params["lr"] = 1.0
    with pytest.raises(TypeError):
        config.params["model"]["hidden"] = 8
    with pytest.raises(AttributeError):
        config.params["sizes"].append(3)
    role = BufferManager(rank=0, config=config, generator=torch.Generator())  # any role: Trainer is abstract
    assert role.params is config.params and isinstance(role.params, FrozenMapping)
    assert config.params == {"model": {"hidden": 64}, "sizes": (1, 2), "lr": 0.1}
    plain = config.to_dict()["params"]
    plain["model"]["hidden"] = 8  # to_dict gives copies to change freely
    assert config.params["model"]["hidden"] == 64 and plain["sizes"] == [1, 2]
