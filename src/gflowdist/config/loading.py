"""Turning YAML text, dicts and ``key=value`` overrides into section dataclasses.

Nothing here knows the sections; :mod:`gflowdist.config.schema` passes its
dataclasses in. The rules:

* YAML is parsed safely (a :class:`yaml.SafeLoader` subclass): no Python
  objects are ever constructed. Two additions over plain ``yaml.safe_load``:
  ``1e-3`` is read as a float (YAML 1.2; PyYAML alone reads it as the string
  ``"1e-3"``), and a key written twice in one mapping is an error instead of
  the last one silently winning.
* A section is a mapping of known keys; an unknown key is an error that names
  the nearest valid key. An empty section (``layout:`` with nothing under it)
  means all defaults.
* An override is ``dotted.key=value``; the value is parsed as YAML, so
  ``layout.buffers=2`` gives an int, ``coordinator=false`` a bool and
  ``mpiexec_args=[--bind-to, core]`` a list.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import yaml

from gflowdist.config.checks import found, suggest
from gflowdist.config.limits import MAX_FILE_BYTES, check_document, check_file_size
from gflowdist.errors import ConfigError

__all__ = [
    "parse_yaml",
    "read_yaml_file",
    "section_from_mapping",
    "parse_override",
    "override_for",
    "shown_override",
    "set_in_tree",
    "known_keys",
]


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-3`` as a float and refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"duplicate key '{key_node.value}'",
                        key_node.start_mark,
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, *, file: str | None = None) -> Any:
    """Parse YAML text safely; syntax errors become :class:`ConfigError` with the line.

    The document is checked against :mod:`gflowdist.config.limits` (value sizes, aliases expanded) after it is
    composed and before any Python object is built from it.
    """
    loader = _ConfigLoader(text)
    try:
        node = loader.get_single_node()
        check_document(node, file=file)
        return loader.construct_document(node) if node is not None else None
    except RecursionError:
        raise ConfigError("the YAML is nested too deeply to read", file=file) from None
    except yaml.MarkedYAMLError as err:
        raise ConfigError(yaml_problem(err, text), file=file) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML: {err}", file=file) from None
    finally:
        loader.dispose()


def yaml_problem(err: yaml.MarkedYAMLError, text: str) -> str:
    """``invalid YAML at line 4, column 7: expected ',' or '}', but got ':'; the flow mapping opened at
    line 3, column 9 (launch: {nprocs: 4) is not closed``: where the parser gave up, and where the structure
    it was reading began (PyYAML's ``context_mark``), with that line's text."""
    mark = err.problem_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    message = f"invalid YAML{where}: {err.problem}"
    opened = err.context_mark
    if (
        opened is not None
        and err.context
        and (mark is None or opened.line != mark.line or opened.column != mark.column)
    ):
        what = err.context.removeprefix("while ").removeprefix("parsing ").removeprefix("scanning ")
        lines = text.splitlines()
        shown = lines[opened.line].strip() if opened.line < len(lines) else ""
        message += (
            f"; {what} began at line {opened.line + 1}, column {opened.column + 1}"
            + (f" ({shown[:60]})" if shown else "")
            + (", and is not closed" if "flow" in what or "quoted" in what else "")
        )
    return message


def read_yaml_file(path: str | os.PathLike[str]) -> Any:
    """Read and parse one YAML file; a missing or unreadable file is a :class:`ConfigError`, and so is one larger
    than :data:`~gflowdist.config.limits.MAX_FILE_BYTES` (refused before it is read)."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as handle:
            check_file_size(os.fstat(handle.fileno()).st_size, file=name)
            text = handle.read(MAX_FILE_BYTES + 1)  # a pipe or device has no size to check beforehand
            check_file_size(len(text.encode()), file=name)
    except FileNotFoundError:
        raise ConfigError("config file not found", file=name) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read config file: {err}", file=name) from None
    return parse_yaml(text, file=name)


def known_keys(cls: type) -> list[str]:
    """The keys a section dataclass accepts (its init fields), in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def section_from_mapping(cls: type, data: Any, key: str) -> Any:
    """Build section dataclass ``cls`` from ``data`` found at ``key`` (``None`` = defaults).

    Unknown keys raise ``ConfigError(key="<key>.<unknown>")`` with the nearest valid key;
    value checks are the dataclass's own (its ``__post_init__``).
    """
    if data is None:
        return cls()
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping of settings, found {found(data)}", key=key)
    valid = known_keys(cls)
    for name in data:
        removed: dict[str, str] = getattr(cls, "removed", {})
        if isinstance(name, str) and name in removed:
            raise ConfigError(removed[name], key=f"{key}.{name}")
        if not isinstance(name, str) or name not in valid:
            hint = suggest(name, valid) if isinstance(name, str) else ""
            raise ConfigError(f"unknown key '{name}'{hint}; valid keys are: {', '.join(valid)}", key=f"{key}.{name}")
    return cls(**dict(data))


_KEY_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*)*")


def override_for(text: str) -> str | None:
    """The override a YAML-style ``key.path:value`` (or ``key.path: value``) meant, e.g. ``run.steps=5``;
    None when ``text`` is not one (no colon, or no key path before it)."""
    key, colon, value = text.partition(":")
    if not colon or not _KEY_PATH.fullmatch(key.strip()) or not value.strip():
        return None
    return f"{key.strip()}={value.strip()}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"layout.buffers=2"`` -> ``(["layout", "buffers"], 2)``; the value is parsed as YAML."""
    if not isinstance(text, str):
        raise ConfigError(f"an override must look like 'section.key=value', found {found(text)}")
    if "=" not in text:
        meant = override_for(text)
        if meant is not None:
            raise ConfigError(f"'{text}' is YAML, not an override: write {meant} (key.path=value)")
        raise ConfigError(f"'{text}' is not an override: write {text}=VALUE (key.path=value, no spaces)")
    dotted, _, raw = text.partition("=")
    path = dotted.strip().split(".")
    if any(not part for part in path):
        raise ConfigError(f"an override must look like 'section.key=value', found {text!r}")
    try:
        value = parse_yaml(raw)
    except ConfigError as err:
        raise ConfigError(
            f"cannot parse the value of override {shown_override(text)}: {err.detail}", key=".".join(path)
        ) from None
    return path, value


def shown_override(text: str, width: int = 80) -> str:
    """``text`` quoted for a message, cut to ``width`` characters with its length when longer."""
    if len(text) <= width:
        return repr(text)
    return f"{text[:width]!r}... ({len(text):,} characters)"


def set_in_tree(tree: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``tree[path[0]][path[1]]... = value``, creating missing mappings on the way."""
    node = tree
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"cannot set a key inside {found(child)}", key=".".join(path[: depth + 1]))
        node = child
    node[path[-1]] = value
