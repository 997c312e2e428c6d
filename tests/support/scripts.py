"""Import a script that imports its siblings by bare name (an example, a benchmark) from a test.

A script run as ``python folder/script.py`` finds its siblings because Python
puts ``folder`` first on ``sys.path``. :func:`load_script` gives a test the
same view while the script loads, and takes ``folder`` off ``sys.path``
again afterwards, so the test suite's own imports never depend on it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["load_script"]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module of ``path``, registered as ``name`` (default: the file's stem) in ``sys.modules``.

    A module of that name already loaded from the same file is returned as it
    is (a sibling the script imported, or an earlier call).
    """
    path = Path(path).resolve()
    name = name or path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == path:
        return loaded
    folder = str(path.parent)
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        return module
    finally:
        sys.path.remove(folder)
