"""Read-only values for ``params``: nested mappings you can read but not change.

``Config.params`` and every role's ``self.params`` is a :class:`FrozenMapping`:
a mapping of the YAML values in which nested mappings are frozen too and
lists are tuples, so nothing reached through it can change the loaded
config (``params["model"]["hidden"] = 8`` and ``params["sizes"].append(8)``
both fail). :func:`thaw` gives plain, mutable, YAML/JSON-ready copies back
(``Config.to_dict`` uses it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["FrozenMapping", "freeze", "thaw"]


class FrozenMapping(Mapping):
    """An immutable mapping (``dict``'s reading methods; no item assignment, no ``update``)."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any] | None = None):
        object.__setattr__(self, "_items", {key: freeze(value) for key, value in (items or {}).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"FrozenMapping({self._items!r})"

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    # equal to dicts, which are unhashable
    __hash__ = None  # type: ignore[assignment]

    def __copy__(self) -> FrozenMapping:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenMapping:
        return self


def freeze(value: Any) -> Any:
    """``value`` with every mapping made a :class:`FrozenMapping` and every list a tuple, recursively."""
    if isinstance(value, FrozenMapping):
        return value
    if isinstance(value, Mapping):
        return FrozenMapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A plain copy: mappings become dicts and tuples lists, recursively."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value
