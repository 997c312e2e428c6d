"""How big a config may be: the file, one value, and the whole once its YAML aliases are expanded.

A config is a few dozen settings; these limits are far above any real one and
refuse, in one line naming the file and the key, before anything launches:

* a file larger than :data:`MAX_FILE_BYTES` (a 50 MB YAML list would take
  minutes to parse, on the launcher and again on every rank);
* a single value (a string, a number's text, a key) longer than
  :data:`MAX_VALUE_CHARS`;
* a document that holds more than :data:`MAX_NODES` values once its aliases
  are expanded: a "billion laughs" (``a: &a [x, x]``, ``b: &b [*a, *a]``, ...)
  is a few lines of YAML but 2^30 values once frozen, copied or written;
  a recursive alias (``a: &a [*a]``) is refused too.

The check walks PyYAML's node graph *before* any Python object is built, with
each shared (aliased) node counted once per use but walked once, so the
check itself stays cheap whatever the expansion would cost.
"""

from __future__ import annotations

import yaml

from gflowdist.errors import ConfigError

__all__ = ["MAX_FILE_BYTES", "MAX_VALUE_CHARS", "MAX_NODES", "check_document", "check_file_size"]

#: The largest config file read (bytes); a bigger one is refused before it is read.
MAX_FILE_BYTES = 1 << 20
#: The longest single value or key a config may hold (characters).
MAX_VALUE_CHARS = 64 << 10
#: The most values (scalars, lists, mappings) a config may hold once its YAML aliases are expanded.
MAX_NODES = 100_000


def check_file_size(size: int, *, file: str) -> None:
    """Refuse a config file of ``size`` bytes above :data:`MAX_FILE_BYTES`."""
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            f"the file is {size:,} bytes; a config file may hold at most {MAX_FILE_BYTES:,} bytes "
            "(gflowdist.config.limits.MAX_FILE_BYTES): put large data in a file of its own and name it in params",
            file=file,
        )


def check_document(node: yaml.Node | None, *, file: str | None = None) -> None:
    """Refuse a composed YAML document that breaks a limit (see the module docstring); the error names the key."""
    if node is not None:
        _Walk(file).size(node, "")


class _Walk:
    def __init__(self, file: str | None):
        self.file = file
        self.sizes: dict[int, int] = {}  # id(node) -> values under it, aliases expanded
        self.open: set[int] = set()  # nodes being walked (a node met again inside itself: a recursive alias)

    def size(self, node: yaml.Node, path: str) -> int:
        known = self.sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in self.open:
            raise ConfigError("a YAML alias refers to the value it is part of (a recursive alias)", **self._at(path))
        if isinstance(node, yaml.ScalarNode):
            self._check_text(node.value, path, "value")
            total = 1
        else:
            self.open.add(id(node))
            total = 1
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                    if isinstance(key, yaml.ScalarNode):
                        self._check_text(key.value, path, "key")
                    total += self.size(key, path) + self.size(value, f"{path}.{name}" if path else str(name))
            else:
                for index, item in enumerate(node.value):
                    total += self.size(item, f"{path}[{index}]")
            self.open.discard(id(node))
        if total > MAX_NODES:
            raise ConfigError(
                f"holds more than {MAX_NODES:,} values once its YAML aliases are expanded "
                "(gflowdist.config.limits.MAX_NODES; a 'billion laughs' of aliases?)",
                **self._at(path),
            )
        self.sizes[id(node)] = total
        return total

    def _check_text(self, text: str, path: str, what: str) -> None:
        if len(text) > MAX_VALUE_CHARS:
            raise ConfigError(
                f"a {what} of {len(text):,} characters; a config {what} may hold at most {MAX_VALUE_CHARS:,} "
                "(gflowdist.config.limits.MAX_VALUE_CHARS): put large data in a file of its own and name it in params",
                **self._at(path),
            )

    def _at(self, path: str) -> dict:
        return {"key": path or "(the document)", "file": self.file}
