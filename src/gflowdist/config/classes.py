"""Importing the user's role classes named in a config (``roles.trainer: pkg.mod:Class``).

Two forms of reference:

* ``"package.module:Class"`` - imported with :func:`importlib.import_module`.
* ``"path/to/file.py:Class"`` - a file; a relative path is looked up first in the
  directory of the config file, then in the current directory. The file is
  loaded once per absolute path (as module ``gflowdist_user_<stem>_<n>``) and
  reused afterwards.

``Class`` may be dotted (``Outer.Inner``). Every failure is a
:class:`~gflowdist.errors.ConfigError` naming the config key, never a bare
ImportError/AttributeError.

:func:`check_class_ref` answers the cheap questions without importing (and so
without the torch a role module imports): the file exists and parses, it
defines the class (with the nearest name when not), a package's top-level
module can be found. ``gflowdist run`` asks it before it imports anything.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from types import ModuleType

from gflowdist.config.checks import suggest
from gflowdist.errors import ConfigError

__all__ = ["load_class", "check_class_ref", "absolute_ref"]

_FILE_MODULES: dict[str, ModuleType] = {}
"""Absolute file path -> module already loaded from it."""


def _is_file_ref(module: str) -> bool:
    return module.endswith(".py") or "/" in module or os.sep in module


def _candidates(path: str, file: str | None) -> list[str]:
    if os.path.isabs(path):
        return [path]
    places = []
    if file is not None:
        places.append(os.path.join(os.path.dirname(os.path.abspath(file)), path))
    places.append(os.path.join(os.getcwd(), path))
    return list(dict.fromkeys(os.path.normpath(place) for place in places))


def _find_file(path: str, *, key: str, file: str | None) -> str:
    places = _candidates(path, file)
    found_path = next((place for place in places if os.path.isfile(place)), None)
    if found_path is None:
        raise ConfigError(
            f"file '{path}' not found (looked in {', '.join(places)}){_nearest_file(path, places)}", key=key, file=file
        )
    return found_path


def _nearest_file(path: str, places: list[str]) -> str:
    """`` (did you mean 'my_roles.py'?)`` for a Python file next to where ``path`` was looked for."""
    names: set[str] = set()
    for place in places:
        try:
            names.update(entry for entry in os.listdir(os.path.dirname(place)) if entry.endswith(".py"))
        except OSError:
            continue
    close = difflib.get_close_matches(os.path.basename(path), sorted(names), n=1, cutoff=0.75)
    return f" (did you mean '{os.path.join(os.path.dirname(path), close[0])}'?)" if close else ""


def _load_file(path: str, *, key: str, file: str | None) -> ModuleType:
    found_path = _find_file(path, key=key, file=file)
    if found_path in _FILE_MODULES:
        return _FILE_MODULES[found_path]
    stem = os.path.splitext(os.path.basename(found_path))[0]
    name = f"gflowdist_user_{stem}_{len(_FILE_MODULES)}"
    spec = importlib.util.spec_from_file_location(name, found_path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load '{found_path}' as a Python module", key=key, file=file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's module failed while running: say which key led there
        del sys.modules[name]
        raise ConfigError(f"running '{found_path}' raised {type(err).__name__}: {err}", key=key, file=file) from err
    _FILE_MODULES[found_path] = module
    return module


def _import_module(module: str, *, key: str, file: str | None, attr: str = "CLASS") -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if module == missing or module.startswith(missing + "."):
            raise ConfigError(
                f"cannot import module '{module}': no module named '{missing}'{_file_beside(module, file, attr)}",
                key=key,
                file=file,
            ) from None
        raise ConfigError(f"importing module '{module}' failed: {err}", key=key, file=file) from err
    except Exception as err:  # the user's module failed while running: say which key led there
        raise ConfigError(
            f"importing module '{module}' raised {type(err).__name__}: {err}", key=key, file=file
        ) from err


def _file_beside(module: str, file: str | None, attr: str = "CLASS") -> str:
    """``; dice.py is beside the config: ... write dice.py:DiceTrainer`` when ``module`` names a file there."""
    relative = module.replace(".", os.sep) + ".py"
    folder = os.path.dirname(os.path.abspath(file)) if file else os.getcwd()
    if not os.path.isfile(os.path.join(folder, relative)):
        return ""
    return f"; {relative} is beside the config: a file is named with its .py, write {relative}:{attr}"


def load_class(ref: str, *, key: str, file: str | None = None, base: type | None = None) -> type:
    """Import the class ``ref`` names (``"pkg.mod:Class"`` or ``"dir/file.py:Class"``).

    ``key`` is the config key it came from (``"roles.trainer"``) and ``file`` the
    config file (relative ``.py`` paths are resolved against its directory, then
    the current directory). With ``base``, the class must be a subclass of it.
    Raises :class:`ConfigError` naming ``key`` when the module, file or class is
    missing or is not a class.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(
            f"expected 'package.module:Class' or 'path/to/file.py:Class', found {ref!r}", key=key, file=file
        )
    module_name, _, attr_path = ref.rpartition(":")
    if _is_file_ref(module_name):
        module = _load_file(module_name, key=key, file=file)
    else:
        module = _import_module(module_name, key=key, file=file, attr=attr_path)
    target: object = module
    walked = module_name
    for part in attr_path.split("."):
        if not hasattr(target, part):
            names = [name for name in dir(target) if not name.startswith("_")]
            raise ConfigError(f"'{walked}' has no attribute '{part}'{suggest(part, names)}", key=key, file=file)
        target = getattr(target, part)
        walked = f"{walked}:{part}" if walked == module_name else f"{walked}.{part}"
    if not inspect.isclass(target):
        raise ConfigError(f"'{ref}' is a {type(target).__name__}, not a class", key=key, file=file)
    if base is not None and not issubclass(target, base):
        raise ConfigError(f"'{ref}' must be a subclass of {base.__module__}.{base.__qualname__}", key=key, file=file)
    return target


def absolute_ref(ref: str, *, key: str, file: str | None = None) -> str:
    """``ref`` with its file path made absolute, where :func:`load_class` would find the file.

    ``"roles.py:Trainer"`` becomes ``"/home/me/project/roles.py:Trainer"``, a
    reference that works from any directory (a run directory's config.yaml
    keeps it so). Module references (``"pkg.mod:Class"``) and absolute paths
    come back unchanged. Raises :class:`ConfigError` when the file is not found.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(
            f"expected 'package.module:Class' or 'path/to/file.py:Class', found {ref!r}", key=key, file=file
        )
    module_name, _, attr_path = ref.rpartition(":")
    if not _is_file_ref(module_name) or os.path.isabs(module_name):
        return ref
    return f"{_find_file(module_name, key=key, file=file)}:{attr_path}"


def check_class_ref(ref: str, *, key: str, file: str | None = None) -> str:
    """Check ``ref`` as far as possible without running any of the user's code; returns it resolved.

    A file reference: the file exists, parses, and binds the class name at
    module level (a class, an import or an assignment; a module with
    ``from x import *`` or a module ``__getattr__`` is given the benefit of
    the doubt). A module reference: its top-level package can be found. The
    messages are those :func:`load_class` gives for the same mistake. The
    result names what ``ref`` resolves to here: ``"/abs/path/file.py:Class"``,
    or ``"<origin of the top-level package>|pkg.mod:Class"``.
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ConfigError(
            f"expected 'package.module:Class' or 'path/to/file.py:Class', found {ref!r}", key=key, file=file
        )
    module_name, _, attr_path = ref.rpartition(":")
    if not _is_file_ref(module_name):
        top = module_name.split(".")[0]
        spec = getattr(sys.modules.get(top), "__spec__", None) or importlib.util.find_spec(top)
        if spec is None:
            raise ConfigError(
                f"cannot import module '{module_name}': no module named '{top}'"
                f"{_file_beside(module_name, file, attr_path)}",
                key=key,
                file=file,
            )
        return f"{spec.origin}|{ref}"
    path = _find_file(module_name, key=key, file=file)
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(), filename=path)
    except SyntaxError as err:
        raise ConfigError(f"'{path}' line {err.lineno}: {err.msg}", key=key, file=file) from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read '{path}': {err}", key=key, file=file) from None
    names, open_ended = _module_level_names(tree.body)
    first = attr_path.split(".")[0]
    if first not in names and not open_ended:
        public = sorted(name for name in names if not name.startswith("_"))
        raise ConfigError(f"'{module_name}' has no attribute '{first}'{suggest(first, public)}", key=key, file=file)
    return f"{path}:{attr_path}"


def _module_level_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """Names a module body binds (descending into if/try/with blocks); True if it may bind others."""
    names: set[str] = set()
    open_ended = False
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            open_ended = open_ended or node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                open_ended = open_ended or alias.name == "*"
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            if isinstance(node, ast.For):
                names.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
            blocks = [getattr(node, field, []) for field in ("body", "orelse", "finalbody")]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            for block in blocks:
                inner, inner_open = _module_level_names(block)
                names |= inner
                open_ended = open_ended or inner_open
        elif isinstance(node, (ast.Match, ast.Global)):  # bindings not followed here
            open_ended = True
    return names, open_ended
