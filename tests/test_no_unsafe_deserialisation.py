"""No code travels on the wire: src/ never uses a deserialiser that can run code.

An AST scan of every module under src/ (imports, aliases and calls, not text
grep, so comments and docstrings may talk about pickle) refuses:

* importing pickle, _pickle, cPickle, dill, cloudpickle, marshal, shelve, joblib
  (``import x``, ``import x as y``, ``from x import ...``, ``__import__("x")``,
  ``importlib.import_module("x")``);
* ``torch.load`` / ``torch.serialization.load`` without the literal keyword
  ``weights_only=True`` (``**kwargs`` does not count);
* ``numpy.load`` with ``allow_pickle`` not literally False/absent;
* ``pandas.read_pickle``, ``yaml.unsafe_load`` / ``yaml.full_load`` (and the
  ``_all`` forms), and ``yaml.load`` / ``yaml.load_all`` whose ``Loader`` is
  not SafeLoader / CSafeLoader / BaseLoader or a class of the same module
  derived from one of them.

Each rule also has a test on a snippet that breaks it, so a scanner that stops
finding things fails here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

FORBIDDEN_MODULES = frozenset({"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"})
FORBIDDEN_CALLS = frozenset(
    {
        "pandas.read_pickle",
        "yaml.unsafe_load",
        "yaml.unsafe_load_all",
        "yaml.full_load",
        "yaml.full_load_all",
        "numpy.load_pickle",
    }
)
TORCH_LOADS = frozenset({"torch.load", "torch.serialization.load"})
YAML_LOADS = frozenset({"yaml.load", "yaml.load_all"})
SAFE_YAML_LOADERS = frozenset(
    {
        "yaml.SafeLoader",
        "yaml.CSafeLoader",
        "yaml.BaseLoader",
        "yaml.CBaseLoader",
        "yaml.loader.SafeLoader",
        "yaml.cyaml.CSafeLoader",
    }
)
DYNAMIC_IMPORTS = frozenset({"__import__", "importlib.import_module"})


def _root(module: str) -> str:
    return module.split(".")[0]


class _Scanner(ast.NodeVisitor):
    """Collects ``"line N: what"`` for every unsafe use in one module."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted name it stands for
        self.class_bases: dict[str, list[str]] = {}  # classes of this module -> dotted bases
        self.problems: list[str] = []

    def _flag(self, node: ast.AST, what: str) -> None:
        self.problems.append(f"line {node.lineno}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if _root(alias.name) in FORBIDDEN_MODULES:
                self._flag(node, f"import {alias.name}")
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else local

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level == 0 and _root(module) in FORBIDDEN_MODULES:
            self._flag(node, f"from {module} import ...")
        for alias in node.names:
            if alias.name in FORBIDDEN_MODULES and node.level == 0 and not module:
                self._flag(node, f"from . import {alias.name}")
            self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}" if module else alias.name

    def resolve(self, node: ast.AST) -> str | None:
        """Dotted name an expression stands for (``np.load`` -> ``numpy.load``), if it is a plain name."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            inner = self.resolve(node.value)
            return f"{inner}.{node.attr}" if inner else None
        return None

    def _safe_yaml_loader(self, name: str | None, seen: frozenset[str] = frozenset()) -> bool:
        if name is None or name in seen:
            return False
        if name in SAFE_YAML_LOADERS:
            return True
        return any(self._safe_yaml_loader(base, seen | {name}) for base in self.class_bases.get(name, ()))

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func)
        keywords = {keyword.arg: keyword.value for keyword in node.keywords}
        spread = None in keywords
        if (
            name in DYNAMIC_IMPORTS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _root(node.args[0].value) in FORBIDDEN_MODULES
        ):
            self._flag(node, f"{name}({node.args[0].value!r})")
        elif name in FORBIDDEN_CALLS:
            self._flag(node, f"{name}(...)")
        elif name in TORCH_LOADS:
            value = keywords.get("weights_only")
            if not (isinstance(value, ast.Constant) and value.value is True):
                self._flag(node, f"{name}(...) without weights_only=True")
        elif name == "numpy.load":
            value = keywords.get("allow_pickle")
            if spread or not (value is None or (isinstance(value, ast.Constant) and value.value is False)):
                self._flag(node, "numpy.load(...) with allow_pickle")
        elif name in YAML_LOADS:
            loader = keywords.get("Loader", node.args[1] if len(node.args) > 1 else None)
            if loader is None or not self._safe_yaml_loader(self.resolve(loader)):
                self._flag(node, f"{name}(...) without a safe Loader")
        self.generic_visit(node)


def find_unsafe(source: str, filename: str = "<snippet>") -> list[str]:
    """Every unsafe deserialisation in ``source``.

    A first pass learns the module's import aliases and class bases (wherever
    they appear), the second judges imports and calls.
    """
    tree = ast.parse(source, filename)
    scanner = _Scanner()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            scanner.visit(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            scanner.class_bases[node.name] = [name for base in node.bases if (name := scanner.resolve(base))]
    scanner.problems.clear()
    scanner.visit(tree)
    return scanner.problems


def test_src_has_no_unsafe_deserialisation():
    files = sorted(SRC.rglob("*.py"))
    assert files, f"no Python files under {SRC}"
    problems = [
        f"{path.relative_to(SRC)}: {problem}"
        for path in files
        for problem in find_unsafe(path.read_text(encoding="utf-8"), str(path))
    ]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "import pickle",
        "import pickle as p",
        "import cloudpickle",
        "import dill.settings",
        "import marshal",
        "import _pickle",
        "import shelve",
        "from pickle import loads",
        "from dill import loads as l",
        "__import__('pickle')",
        "import importlib\nimportlib.import_module('cloudpickle')",
        "from importlib import import_module\nimport_module('marshal')",
        "import torch\ntorch.load(f)",
        "import torch\ntorch.load(f, weights_only=False)",
        "import torch\ntorch.load(f, **opts)",
        "import torch as T\nT.load(f, map_location='cpu')",
        "from torch import load\nload(f)",
        "from torch import load as tl\ntl(f)",
        "import torch.serialization\ntorch.serialization.load(f)",
        "import numpy as np\nnp.load(f, allow_pickle=True)",
        "import numpy\nnumpy.load(f, allow_pickle=flag)",
        "import pandas as pd\npd.read_pickle(f)",
        "import yaml\nyaml.load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.Loader)",
        "import yaml\nyaml.load(text, yaml.UnsafeLoader)",
        "import yaml\nyaml.unsafe_load(text)",
        "import yaml\nyaml.full_load(text)",
        "import yaml\nclass L(yaml.FullLoader): pass\nyaml.load(text, Loader=L)",
    ],
)
def test_scanner_catches(source):
    assert find_unsafe(source) != []


@pytest.mark.parametrize(
    "source",
    [
        '"""We never pickle: see pickle docs."""\n# import pickle',
        "import torch\ntorch.load(f, weights_only=True, map_location='cpu')",
        "from torch import load\nload(f, weights_only=True)",
        "import numpy as np\nnp.load(f)",
        "import numpy as np\nnp.load(f, allow_pickle=False)",
        "import yaml\nyaml.safe_load(text)",
        "import yaml\nyaml.load(text, Loader=yaml.SafeLoader)",
        "import yaml\nclass L(yaml.SafeLoader): pass\nclass M(L): pass\nyaml.load(text, Loader=M)",
        "import msgpack\nmsgpack.unpackb(b)",
        "import json\njson.loads(s)",
        "def load(f): return f\nload(1)",
    ],
)
def test_scanner_allows(source):
    assert find_unsafe(source) == []
