"""A role's batch, checked where it is made, in the user's terms: the role class, the method, the field.

Every batch a trainer's or an actor's ``rollout`` returns goes through
:func:`check_batch` before it is shipped or learned from: a dict (or other
mapping) of string keys to tensors, each with one row per trajectory, the
same number of rows in every field, at least one row. What is wrong is named
with the role class and method, e.g.::

    HyperGridTrainer.rollout returned a list: a batch is a dict of tensors, one row per trajectory
    ({'states': tensor[B, ...], ...}), or None when there is nothing to send
    HyperGridTrainer.rollout returned fields with different numbers of rows: 'states' 31,
    'actions' 32, 'log_rewards' 32; every field needs one row per trajectory

raised as :class:`~gflowdist.errors.BatchError` (the run's failure message adds
the rank, its role and host, and the step). The checks cost a look at each
field's type and shape; ``faults.on_nonfinite_batch: fail`` adds a scan of
every floating-point field for NaN and infinities.

Before a trainer concatenates its fresh batch with the replayed one,
:func:`refusal_before_concat` compares the two in the words its buffer's
refusal uses (:func:`gflowdist.replay.storage.schema_difference`): a batch
whose fields, per-item shapes or dtypes changed is one its buffer refuses, and
it is refused here too (``faults.on_bad_batch``) instead of ending in torch's
``Sizes of tensors must match``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.errors import BatchError
from gflowdist.replay.storage import schema_difference

__all__ = ["check_batch", "refusal_before_concat", "role_method", "PRIORITY_FIELDS"]

#: Fields a prioritized buffer adds to a replayed batch (not stored: not part of what a client sends).
PRIORITY_FIELDS = ("weights", "keys")

_SHAPE_HINT = "a batch is a dict of tensors, one row per trajectory ({'states': tensor[B, ...], ...})"


def role_method(role: object, method: str) -> str:
    """``"HyperGridTrainer.rollout"``: how messages name the user's method."""
    return f"{type(role).__name__}.{method}"


def check_batch(batch: Any, where: str, *, nonfinite: str = "allow") -> int:
    """Check a batch ``where`` (``"Class.method"``) returned; returns its number of trajectories.

    ``nonfinite``: ``faults.on_nonfinite_batch`` (``fail`` refuses NaN or infinite values in a float field).
    Raises :class:`BatchError` naming ``where`` and the field (see the module docstring).
    """
    if not isinstance(batch, Mapping):
        raise BatchError(
            f"{where} returned {_a(batch)}: {_SHAPE_HINT}, or None when there is nothing to send", where=where
        )
    if not batch:
        raise BatchError(f"{where} returned an empty dict: {_SHAPE_HINT}", where=where)
    rows: dict[str, int] = {}
    for key, value in batch.items():
        if not isinstance(key, str):
            raise BatchError(
                f"{where} returned a batch with the key {key!r} ({type(key).__name__}): field names are strings",
                where=where,
                key=str(key),
            )
        if not isinstance(value, torch.Tensor):
            raise BatchError(
                f"{where} returned a batch whose field {key!r} is {_a(value)}, not a torch.Tensor{_tensor_hint(value)}",
                where=where,
                key=key,
            )
        if value.dim() == 0:
            raise BatchError(
                f"{where} returned a batch whose field {key!r} is a 0-d tensor: every field needs one row per "
                f"trajectory (shape [B, ...])",
                where=where,
                key=key,
            )
        rows[key] = int(value.shape[0])
    if len(set(rows.values())) > 1:
        counts = ", ".join(f"{key!r} {n}" for key, n in rows.items())
        raise BatchError(
            f"{where} returned fields with different numbers of rows: {counts}; every field needs one row per "
            f"trajectory",
            where=where,
            key=_odd_one_out(rows),
        )
    n = next(iter(rows.values()))
    if n == 0:
        raise BatchError(
            f"{where} returned a batch of 0 trajectories (every field has 0 rows): return None when there is "
            f"nothing to send",
            where=where,
            key=next(iter(rows)),
        )
    if nonfinite == "fail":
        _check_finite(batch, where)
    return n


def refusal_before_concat(fresh: Mapping[str, torch.Tensor], replayed: Mapping[str, torch.Tensor] | None) -> str | None:
    """Why my buffer refuses ``fresh``, judged against ``replayed`` (what it stores), in its words; None: it fits.

    A prioritized buffer's ``weights`` and ``keys`` are not stored fields (unless my batch has them too).
    """
    if not replayed:
        return None
    stored = {k: v for k, v in replayed.items() if k in fresh or k not in PRIORITY_FIELDS}
    return schema_difference(fresh, stored)


def _check_finite(batch: Mapping[str, torch.Tensor], where: str) -> None:
    for key, value in batch.items():
        if not (value.is_floating_point() or value.is_complex()):
            continue
        bad = ~torch.isfinite(value.detach())
        if bool(bad.any()):
            rows = torch.nonzero(bad.reshape(value.shape[0], -1).any(dim=1)).flatten().tolist()
            shown = ", ".join(str(r) for r in rows[:5]) + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")
            kind = "NaN" if bool(torch.isnan(value.detach()).any()) else "an infinite value"
            raise BatchError(
                f"{where} returned {kind} in field {key!r} ({'rows' if len(rows) > 1 else 'row'} {shown} of {value.shape[0]}) "
                f"(faults.on_nonfinite_batch = fail; 'allow' would ship it)",
                where=where,
                key=key,
            )


def _a(value: object) -> str:
    """``a list``, ``a numpy.ndarray``, ``a torch.Tensor``: the type of what a role returned."""
    kind = type(value)
    module = kind.__module__.split(".")[0]
    name = kind.__name__ if module == "builtins" else f"{module}.{kind.__name__}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _tensor_hint(value: object) -> str:
    if type(value).__module__ == "numpy":
        return " (torch.from_numpy(...) makes one)"
    if isinstance(value, (list, tuple, int, float, bool)):
        return " (torch.as_tensor(...) makes one)"
    return ""


def _odd_one_out(rows: Mapping[str, int]) -> str:
    """The first field whose row count differs from the most common one."""
    counts: dict[int, int] = {}
    for n in rows.values():
        counts[n] = counts.get(n, 0) + 1
    usual = max(counts, key=lambda n: counts[n])
    return next(key for key, n in rows.items() if n != usual)
