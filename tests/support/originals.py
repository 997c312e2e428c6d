"""Where the differential tests get the original libraries' distributed helpers.

- Spinning Up is not on PyPI: its ``mpi_tools.py`` / ``mpi_pytorch.py`` are
  kept verbatim in ``tests/originals`` (MIT, see its README).
- OmniSafe 0.5.0 and torchgfn 2.4.1: ``pip download --no-deps`` of the
  release wheel (once, into a cache folder), then the one file
  ``utils/distributed.py`` is read out of it and loaded as a module of its
  own. Neither library's heavy dependencies are needed: the file imports only
  numpy, torch and mpi4py.
- torchgfn's newest ``gfn/utils/distributed.py`` (with ``RankLayout``) is not
  released on PyPI: it is kept verbatim in ``tests/originals/torchgfn``
  (Apache 2.0); ``GFLOWDIST_TORCHGFN_SRC`` may name another checkout of
  torchgfn (or the file itself) to compare against.

Each function returns a path, or calls ``pytest.skip`` with the reason the
original could not be obtained: a differential test never passes without
its original.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.launching import REPO

__all__ = [
    "ORIGINALS",
    "load_file",
    "omnisafe_distributed",
    "torchgfn_distributed",
    "torchgfn_newest_distributed",
]

#: the folder holding the verbatim Spinning Up package (put it on ``sys.path``)
ORIGINALS = REPO / "tests" / "originals"


def _cache() -> Path:
    root = os.environ.get("GFLOWDIST_ORIGINALS_CACHE") or str(Path.home() / ".cache" / "gflowdist-originals")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _from_wheel(project: str, version: str, member: str) -> Path:
    """``member`` of ``project==version``'s wheel, extracted to the cache (downloaded the first time)."""
    target = _cache() / f"{project}-{version}" / member
    if target.is_file():
        return target
    wheels = _cache() / "wheels"
    wheels.mkdir(exist_ok=True)
    found = sorted(wheels.glob(f"{project}-{version}-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{project}=={version}", "-d", str(wheels)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"original {project}=={version} not obtainable: pip download failed ({err})")
        found = sorted(wheels.glob(f"{project}-{version}-*.whl"))
        if done.returncode != 0 or not found:
            pytest.skip(f"original {project}=={version} not obtainable: pip download said {done.stderr[-400:]!r}")
    with zipfile.ZipFile(found[0]) as wheel:
        try:
            data = wheel.read(member)
        except KeyError:
            pytest.skip(f"original {project}=={version}: its wheel has no {member}")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


def omnisafe_distributed() -> Path:
    """OmniSafe 0.5.0's ``omnisafe/utils/distributed.py``."""
    return _from_wheel("omnisafe", "0.5.0", "omnisafe/utils/distributed.py")


def torchgfn_distributed() -> Path:
    """torchgfn 2.4.1's ``gfn/utils/distributed.py`` (the newest release on PyPI)."""
    return _from_wheel("torchgfn", "2.4.1", "gfn/utils/distributed.py")


def torchgfn_newest_distributed() -> Path:
    """torchgfn's unreleased ``gfn/utils/distributed.py`` (``RankLayout``): kept here, or ``GFLOWDIST_TORCHGFN_SRC``."""
    given = os.environ.get("GFLOWDIST_TORCHGFN_SRC")
    path = Path(given) if given else ORIGINALS / "torchgfn" / "distributed.py"
    if path.is_dir():
        path = path / "src" / "gfn" / "utils" / "distributed.py"
    if not path.is_file() or "class RankLayout" not in path.read_text():
        pytest.skip(f"{path}: no torchgfn gfn/utils/distributed.py with RankLayout there")
    return path


def load_file(path: Path, name: str) -> ModuleType:
    """The Python file ``path`` as a module of its own named ``name`` (not left in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
