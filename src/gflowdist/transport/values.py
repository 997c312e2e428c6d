"""Which Python values a message body may hold, checked on both sides of the wire.

A body is a tree of

    None, bool, int (-2**63 <= i < 2**64), float, str, bytes,
    list / tuple (a tuple arrives as a list), dict with str keys,
    numpy.ndarray and torch.Tensor of a dtype in SUPPORTED_DTYPES,
    numpy scalars of bool / integer / float16-64 (they arrive as the Python scalar),

nested at most ``MAX_NESTING_DEPTH`` containers deep (the body itself, when it
is a list or dict, is depth 1; arrays are leaves). Subclasses of int, float,
str, list and dict travel as their base type (an ``IntEnum`` arrives as int).

The sender checks the tree before packing it (:func:`check_body`, raising
:class:`EncodeError`); the receiver checks what msgpack produced
(:func:`check_received_body`, raising :class:`~gflowdist.errors.ProtocolError`)
because a hand-made message can hold bytes keys, msgpack timestamps or a
nesting bomb that no gflowdist sender would produce.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np
import torch

from gflowdist.errors import ProtocolError, TransportError

__all__ = ["EncodeError", "MAX_NESTING_DEPTH", "check_body", "check_received_body", "format_path"]

#: Deepest container nesting a body may have (the body itself is depth 1).
MAX_NESTING_DEPTH = 32

_SCALARS = frozenset((type(None), bool, int, float, str, bytes))
_NUMPY_SCALARS = (np.bool_, np.integer, np.float16, np.float32, np.float64)


class EncodeError(TransportError, ValueError):
    """A message cannot be encoded: a value, key, dtype or header field the wire does not carry.

    Raised by the sender before anything is sent; the message names the place in
    the body (``body['obs'][2]``) and what was wrong there.
    """


def format_path(path: tuple[Any, ...]) -> str:
    """``('obs', 2)`` -> ``"body['obs'][2]"``."""
    return "body" + "".join(f"[{step!r}]" for step in path)


def check_body(body: Any) -> bool:
    """Raise :class:`EncodeError` unless ``body`` is a tree the wire carries.

    Returns whether the tree holds arrays, tensors or numpy scalars, i.e.
    whether the packer needs its ``default`` hook.
    """
    return _check(body, 0, ())


def _check(value: Any, depth: int, path: tuple[Any, ...]) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return False
    if kind is np.ndarray or kind is torch.Tensor:
        return True
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, (np.ndarray, torch.Tensor, _NUMPY_SCALARS)):
        return True
    elif isinstance(value, (int, float, str, bytes)):
        return False
    else:
        raise EncodeError(
            f"{format_path(path)}: a {type(value).__module__}.{type(value).__qualname__} "
            "cannot travel; allowed are None, bool, int, float, str, bytes, list, tuple, "
            "dict with str keys, numpy arrays and torch tensors"
        )
    if depth >= MAX_NESTING_DEPTH:
        raise EncodeError(
            f"{format_path(path)}: nested deeper than {MAX_NESTING_DEPTH} containers "
            "(or the body contains a reference cycle)"
        )
    is_dict = type(items) is not enumerate
    special = False
    for key, item in items:
        if is_dict and type(key) is not str and not isinstance(key, str):
            raise EncodeError(f"{format_path(path)}: dict key {key!r} is a {type(key).__name__}; only str keys travel")
        kind = type(item)
        if kind in _SCALARS:
            continue
        if kind is np.ndarray or kind is torch.Tensor:
            special = True
        else:
            special = _check(item, depth + 1, (*path, key)) or special
    return special


def check_received_body(body: Any, sender: int) -> None:
    """Raise :class:`ProtocolError` unless a decoded body is a tree :func:`check_body` accepts.

    msgpack already guarantees the leaf types except two: a bin-typed map key
    (arrives as bytes) and the msgpack timestamp extension (type -1, which
    msgpack decodes itself instead of passing it to our ext hook).
    """
    kind = type(body)
    if kind is dict or kind is list:
        _check_received(body, 1, (), sender)
    elif kind is msgpack.Timestamp:
        raise ProtocolError("body is a msgpack timestamp, which gflowdist never sends", sender=sender)


def _check_received(value: dict[Any, Any] | list[Any], depth: int, path: tuple[Any, ...], sender: int) -> None:
    if depth > MAX_NESTING_DEPTH:
        raise ProtocolError(f"{format_path(path)}: nested deeper than {MAX_NESTING_DEPTH} containers", sender=sender)
    items = value.items() if type(value) is dict else enumerate(value)
    for key, item in items:
        if type(key) is bytes:
            raise ProtocolError(
                f"{format_path(path)}: map key {key!r} is bytes; only str keys are allowed", sender=sender
            )
        kind = type(item)
        if kind is dict or kind is list:
            _check_received(item, depth + 1, (*path, key), sender)
        elif kind is msgpack.Timestamp:
            raise ProtocolError(
                f"{format_path((*path, key))}: msgpack timestamp, which gflowdist never sends", sender=sender
            )
