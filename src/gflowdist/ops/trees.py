"""Nested containers of tensors ("trees"): dicts, lists, tuples and namedtuples.

A *leaf* is anything that is not a dict, list or tuple. :func:`tree_map`
rebuilds the same structure (same container types, same keys, same order)
around new leaves; :func:`tree_leaves` lists the leaves in that order (dicts
in their insertion order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["tree_map", "tree_leaves"]


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with every leaf replaced by ``fn(leaf)``; containers are rebuilt, never mutated."""
    if isinstance(tree, dict):
        return type(tree)((key, tree_map(fn, value)) for key, value in tree.items())
    if _is_namedtuple(tree):
        return type(tree)(*(tree_map(fn, value) for value in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(tree_map(fn, value) for value in tree)
    return fn(tree)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in the order :func:`tree_map` visits them."""
    leaves: list[Any] = []
    tree_map(leaves.append, tree)
    return leaves
