"""What one configuration value may be: small check objects used as field metadata.

Every field of a config section carries a :class:`Check` in its metadata. A
check does two things:

* ``check(value)`` returns the value in its stored form (an ``int`` where a
  float is expected becomes ``float``, a list of strings becomes a tuple) or
  raises :class:`~gflowdist.errors.ConfigError` with a message of the form
  ``"expected <what>, found <type> <value>"``. The caller adds the key path
  and the file.
* ``check.describe()`` is the human name of the accepted values, used for the
  generated reference table in ``docs/configuration.md``.

``bool`` is never accepted where a number is expected, although Python treats
``True`` as ``1``: ``steps: yes`` is a mistake, not ``steps: 1``.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gflowdist.errors import ConfigError

__all__ = [
    "Check",
    "ModuleListCheck",
    "IntCheck",
    "FloatCheck",
    "BoolCheck",
    "StrCheck",
    "ChoiceCheck",
    "CountCheck",
    "StrListCheck",
    "ClassRefCheck",
    "OptionalCheck",
    "MappingCheck",
    "DevicesCheck",
    "found",
    "suggest",
]


def found(value: Any) -> str:
    """``"int 3"``, ``"str 'x'"``, ``"bool True"``, ``"nothing (null)"``: what a value was."""
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def suggest(name: str, candidates: Sequence[str]) -> str:
    """`` (did you mean 'buffers'?)`` for the nearest candidate, or ``""``."""
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bound_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high}")
    return " and ".join(parts)


class Check:
    """Base class: validate and normalise one value."""

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def fail(self, value: Any, extra: str = "") -> ConfigError:
        """The error for ``value``: ``expected <describe()>, found <value><extra>``."""
        return ConfigError(f"expected {self.expected()}, found {found(value)}{extra}")

    def expected(self) -> str:
        """The phrase used after "expected" in error messages."""
        return self.describe()


class IntCheck(Check):
    """An integer (not a bool) with optional bounds: ``IntCheck(low=1)`` means ``>= 1``."""

    def __init__(self, low: int | None = None, high: int | None = None):
        self.low = low
        self.high = high

    def __call__(self, value: Any) -> int:
        if not _is_int(value):
            raise self.fail(value)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise self.fail(value)
        return int(value)

    def describe(self) -> str:
        bounds = _bound_text(self.low, self.high, False, False)
        return f"int {bounds}" if bounds else "int"

    def expected(self) -> str:
        bounds = _bound_text(self.low, self.high, False, False)
        return f"an integer {bounds}" if bounds else "an integer"


class FloatCheck(Check):
    """A finite number stored as ``float``; ints are accepted, bools are not.

    ``low_open=True`` makes the lower bound strict (``> low``).
    """

    def __init__(
        self, low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False
    ):
        self.low = low
        self.high = high
        self.low_open = low_open
        self.high_open = high_open

    def __call__(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(value)
        number = float(value)
        if not math.isfinite(number):
            raise self.fail(value)
        if self.low is not None and (number <= self.low if self.low_open else number < self.low):
            raise self.fail(value)
        if self.high is not None and (number >= self.high if self.high_open else number > self.high):
            raise self.fail(value)
        return number

    def _bounds(self) -> str:
        return _bound_text(self.low, self.high, self.low_open, self.high_open)

    def describe(self) -> str:
        bounds = self._bounds()
        return f"float {bounds}" if bounds else "float"

    def expected(self) -> str:
        bounds = self._bounds()
        return f"a finite number {bounds}" if bounds else "a finite number"


class BoolCheck(Check):
    """``true`` or ``false`` only (not 0/1, not strings)."""

    def __call__(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(value)
        return value

    def describe(self) -> str:
        return "bool"

    def expected(self) -> str:
        return "true or false"


class StrCheck(Check):
    """A string; ``nonempty`` rejects ``""``; ``name_like`` also rejects path separators."""

    def __init__(self, *, nonempty: bool = False, name_like: bool = False):
        self.nonempty = nonempty or name_like
        self.name_like = name_like

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(value)
        if self.nonempty and not value:
            raise self.fail(value)
        if self.name_like and ("/" in value or "\\" in value or value in (".", "..")):
            raise self.fail(value, " (it names a directory, so it may not contain '/' or be '.' or '..')")
        return value

    def describe(self) -> str:
        return "str (a name: no '/')" if self.name_like else ("str (non-empty)" if self.nonempty else "str")

    def expected(self) -> str:
        if self.name_like:
            return "a non-empty name without '/'"
        return "a non-empty string" if self.nonempty else "a string"


class ChoiceCheck(Check):
    """One of a closed set of strings; a near miss gets a suggestion."""

    def __init__(self, *options: str):
        self.options = options

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.options:
            hint = suggest(value, self.options) if isinstance(value, str) else ""
            raise self.fail(value, hint)
        return value

    def describe(self) -> str:
        return " \\| ".join(f'"{option}"' for option in self.options)

    def expected(self) -> str:
        return "one of " + ", ".join(f"'{option}'" for option in self.options)


class CountCheck(Check):
    """A rank count: an integer ``>= 0`` or the word ``"rest"`` (whatever ranks are left)."""

    REST = "rest"

    def __call__(self, value: Any) -> int | str:
        if value == self.REST and isinstance(value, str):
            return self.REST
        if not _is_int(value) or value < 0:
            hint = suggest(value, [self.REST]) if isinstance(value, str) else ""
            raise self.fail(value, hint)
        return int(value)

    def describe(self) -> str:
        return 'int >= 0 \\| "rest"'

    def expected(self) -> str:
        return "an integer >= 0 or 'rest'"


class StrListCheck(Check):
    """A list of strings, stored as a tuple. A lone string is refused (it is not split)."""

    def __call__(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            raise self.fail(value, " (write a list, e.g. ['--bind-to', 'core'])")
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise self.fail(value)
        return tuple(value)

    def describe(self) -> str:
        return "list[str]"

    def expected(self) -> str:
        return "a list of strings"


_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = re.compile(rf"{_IDENTIFIER}(\.{_IDENTIFIER})*")


class ModuleListCheck(StrListCheck):
    """A list of dotted module names (``["torch._dynamo", "gymnasium"]``); only their form is checked here."""

    def __call__(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            raise self.fail(value, f" (write a list, e.g. [{value}])")
        names = super().__call__(value)
        for name in names:
            if not _DOTTED.fullmatch(name):
                raise self.fail(value, f" ({name!r} is not a module name)")
        return names

    def describe(self) -> str:
        return "list[module]"

    def expected(self) -> str:
        return "a list of module names"


class ClassRefCheck(Check):
    """A class reference ``"package.module:Class"`` or ``"path/to/file.py:Class"``.

    Only the form is checked here; :func:`gflowdist.config.load_class` imports it.
    """

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(value)
        module, sep, attr = value.rpartition(":")
        if not sep or not module or not _DOTTED.fullmatch(attr):
            raise self.fail(value)
        if not module.endswith(".py") and not _DOTTED.fullmatch(module):
            raise self.fail(value)
        return value

    def describe(self) -> str:
        return '"pkg.module:Class" \\| "file.py:Class"'

    def expected(self) -> str:
        return "a class reference 'package.module:Class' or 'path/to/file.py:Class'"


class OptionalCheck(Check):
    """``null`` or whatever ``inner`` accepts."""

    def __init__(self, inner: Check):
        self.inner = inner

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.inner(value)
        except ConfigError as err:
            raise ConfigError(err.detail.replace("expected ", "expected null or ", 1)) from None

    def describe(self) -> str:
        return f"{self.inner.describe()} \\| null"

    def expected(self) -> str:
        return f"null or {self.inner.expected()}"


class MappingCheck(Check):
    """A mapping with string keys (values are free-form YAML values)."""

    def __call__(self, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(value)
        for key in value:
            if not isinstance(key, str):
                raise ConfigError(f"expected string keys, found key {found(key)}")
        return dict(value)

    def describe(self) -> str:
        return "mapping (str keys)"

    def expected(self) -> str:
        return "a mapping with string keys"


_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


class DevicesCheck(Check):
    """``"auto"``, ``"cpu"``, ``"cuda"``, or a list of ``cpu`` / ``cuda`` / ``cuda:N`` (stored as a tuple)."""

    WORDS = ("auto", "cpu", "cuda")

    def __call__(self, value: Any) -> str | tuple[str, ...]:
        if isinstance(value, str):
            if value not in self.WORDS:
                raise self.fail(value, suggest(value, self.WORDS))
            return value
        if not isinstance(value, (list, tuple)) or not value:
            raise self.fail(value)
        for item in value:
            if not isinstance(item, str) or not _DEVICE.fullmatch(item):
                raise self.fail(value, f" (the entry {found(item)} is not cpu, cuda or cuda:N)")
        return tuple(value)

    def describe(self) -> str:
        return '"auto" \\| "cpu" \\| "cuda" \\| list[str]'

    def expected(self) -> str:
        return "'auto', 'cpu', 'cuda', or a non-empty list of 'cpu' / 'cuda' / 'cuda:N'"
