"""A griffe extension for the API reference: Sphinx roles in docstrings become cross-references.

gflowdist's docstrings name other objects the Sphinx way (``:class:`~gflowdist.replay.ReplayBuffer```,
``:meth:`sample```) and show code after a line ending in ``::``. MkDocs renders Markdown, so
for every docstring of the package, once it is loaded, this extension rewrites:

* ``:role:`target``` and ``:role:`~target``` -> ``[`Name`][full.path]``, a mkdocs-autorefs
  cross-reference, where ``full.path`` is ``target`` resolved the way a reader would:
  as a full path, then in the enclosing scopes (class, module, parent packages), then in
  the classes of the enclosing module (a module docstring saying ``:meth:`extend```),
  then as the unique object of the package whose path ends with ``.target``. The link
  text is the last component (``~``) or the target as written.
* a target outside gflowdist (``importlib.import_module``, ``yaml.SafeLoader``) ->
  plain code, no link.
* a gflowdist target that resolves to nothing -> a warning naming the docstring and
  the target; ``mkdocs build --strict`` turns it into a failure. That is the point:
  a renamed or deleted object cannot leave a dangling reference in the docs.
* a line ending in ``::`` (Sphinx's "literal block follows") ends in ``:`` instead;
  the indented block after it is already a Markdown code block.

Loaded by mkdocstrings-python through ``extensions:`` in ``mkdocs.yml``.
"""

from __future__ import annotations

import importlib
import logging
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([A-Za-z_][\w.]*)(\(\))?`")
LITERAL_BLOCK = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)
BARE_LITERAL_BLOCK = re.compile(r"^[ \t]*::[ \t]*$", re.MULTILINE)
PACKAGE = "gflowdist"

log = logging.getLogger("mkdocs.plugins.gflowdist.rst_roles")


class RstRoles(griffe.Extension):
    """Rewrite the roles of every docstring of the loaded package (see the module docstring)."""

    package = PACKAGE

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != self.package:
            return
        objects = list(_walk(pkg))
        paths = {obj.path: obj.path for obj in objects}
        for alias in _aliases(pkg):  # re-exports: gflowdist.layout.plan_layout -> ...planning.plan_layout
            if alias.target_path in paths:
                paths.setdefault(alias.path, alias.target_path)
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj, obj.docstring.value, paths, package=self.package)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _aliases(module: griffe.Module):
    for member in module.members.values():
        if member.is_alias:
            yield member
        elif member.is_module:
            yield from _aliases(member)


def resolve(obj: griffe.Object, target: str, paths: dict[str, str]) -> str | None:
    """The canonical path ``target`` names when written in ``obj``'s docstring, or None."""
    if target in paths:
        return paths[target]
    scope: griffe.Object | None = obj
    while scope is not None:  # the enclosing scopes, innermost first
        full = f"{scope.path}.{target}"
        if full in paths:
            return paths[full]
        scope = scope.parent
    module = obj if obj.is_module else obj.module
    in_classes = [paths[f"{cls.path}.{target}"] for cls in module.classes.values()
                  if f"{cls.path}.{target}" in paths]
    if len(in_classes) == 1:
        return in_classes[0]
    suffix = {canonical for path, canonical in paths.items() if path.endswith("." + target)}
    return suffix.pop() if len(suffix) == 1 else None


def exists_at_run_time(obj: griffe.Object, target: str) -> bool:
    """True when ``target`` is an attribute chain of ``obj``'s module (or a full path) once imported.

    The fallback for names static analysis cannot see, e.g. ``OK, MISSING = "ok", "MISSING"``.
    """
    module = obj if obj.is_module else obj.module
    candidates = [(module.path, target)]
    parts = target.split(".")
    candidates += [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    for module_name, rest in candidates:
        try:
            value = importlib.import_module(module_name)
            for name in rest.split("."):
                value = getattr(value, name)
        except (ImportError, AttributeError):
            continue
        return True
    return False


def rewrite(obj: griffe.Object, text: str, paths: dict[str, str], *, package: str = PACKAGE) -> str:
    """``text`` with its roles turned into cross-references and ``::`` into ``:``."""

    def replace(match: re.Match) -> str:
        short, target, call = match.group(1), match.group(2), match.group(3) or ""
        label = (target.rsplit(".", 1)[-1] if short else target) + call
        full = resolve(obj, target, paths)
        if full is not None:
            return f"[`{label}`][{full}]"
        if target.split(".")[0] != package and "." in target:
            return f"`{label}`"  # outside gflowdist: no page of ours to link to
        if exists_at_run_time(obj, target):
            return f"`{label}`"  # real, but invisible to static analysis: no anchor to link to
        log.warning("docstring of %s: %s names nothing in %s", obj.path, match.group(0), package)
        return f"`{label}`"

    text = ROLE.sub(replace, text)
    return BARE_LITERAL_BLOCK.sub("", LITERAL_BLOCK.sub(":", text))
