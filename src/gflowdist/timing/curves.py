"""The report's training curves from ``metrics.jsonl``: one per metric, one per role where roles share a name.

Each row of ``metrics.jsonl`` is one rank's metrics at a step. A metric only
one role reports (a trainer's ``loss``, the coordinator's ``eval_return``)
is one curve: at each step, the mean over the ranks that reported it. A
metric several roles report is one curve per role, named ``name (role)``
(``trajectories (trainer)`` and ``trajectories (actor)``): averaged
together they drew a sawtooth of the learner's 0 and the actors' counts.

Curves come in the order the figure draws them by default
(:func:`curve_order`): the coordinator's first (what it records is what the
user evaluates: ``eval_return``), then the trainers', actors', buffers', and
counts last (``trajectories``, and every metric whose values are all ints:
``env_steps``, ``episodes``). ``report.curves`` chooses instead
(:func:`chosen_curves`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["curves_by_step", "curve_order", "chosen_curves", "base_name", "ROLE_ORDER"]

#: Whose metrics come first.
ROLE_ORDER = ("coordinator", "trainer", "actor", "buffer")
#: Metrics that count things: drawn last by default.
COUNTS = ("trajectories", "skipped_steps")
_SKIP = ("rank", "time", "step")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _reporters(rows: Sequence[Mapping[str, Any]], roles: Mapping[int, str]) -> dict[str, list[str]]:
    """``{metric: [roles that report it, first seen first]}``."""
    out: dict[str, list[str]] = {}
    for row in rows:
        role = roles.get(int(row.get("rank", -1)), "?")
        for key, value in row.items():
            if key not in _SKIP and _number(value):
                seen = out.setdefault(key, [])
                if role not in seen:
                    seen.append(role)
    return out


def curves_by_step(rows: Sequence[Mapping[str, Any]], roles: Mapping[int, str] | None = None) -> list[dict]:
    """One row per step: each metric averaged over the ranks that reported it at that step.

    With ``roles`` (``{rank: role}``), a metric reported by ranks of several roles is split into one
    metric per role, ``name (role)`` (module docstring).
    """
    roles = roles or {}
    shared = {k for k, who in _reporters(rows, roles).items() if len(who) > 1} if roles else set()
    by_step: dict[int, dict[str, list[float]]] = {}
    for row in rows:
        values = by_step.setdefault(int(row.get("step", 0)), {})
        role = roles.get(int(row.get("rank", -1)), "?")
        for key, value in row.items():
            if key not in _SKIP and _number(value):
                name = f"{key} ({role})" if key in shared else key
                values.setdefault(name, []).append(float(value))
    return [
        {"step": step, **{k: sum(v) / len(v) for k, v in values.items()}} for step, values in sorted(by_step.items())
    ]


def base_name(curve: str) -> str:
    """``trajectories (actor)`` -> ``trajectories``; a plain name stays."""
    head, sep, tail = curve.rpartition(" (")
    return head if sep and tail.endswith(")") else curve


def _counts(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Metrics that count things: ``trajectories``, and those whose every value is an int (``env_steps``)."""
    floats = {k for row in rows for k, v in row.items() if isinstance(v, float)}
    ints = {k for row in rows for k, v in row.items() if _number(v) and not isinstance(v, float)}
    return (ints - floats) | set(COUNTS)


def curve_order(rows: Sequence[Mapping[str, Any]], roles: Mapping[int, str]) -> list[str]:
    """The curves' names (as :func:`curves_by_step` names them) in the default order (module docstring)."""
    reporters = _reporters(rows, roles)
    counts = _counts(rows)
    names = []
    for key, who in reporters.items():
        if len(who) > 1:
            names += [(f"{key} ({role})", role, key) for role in who]
        else:
            names.append((key, who[0], key))

    def rank(item: tuple[str, str, str]) -> tuple[int, int]:
        _, role, key = item
        return (key in counts, ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER))

    return [name for name, _, _ in sorted(names, key=rank)]  # sorted() keeps first-seen order within a rank


def chosen_curves(available: Sequence[str], wanted: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(curves to draw, wanted names that match none)``: a name matches its curve and its per-role curves."""
    drawn, unknown = [], []
    for name in wanted:
        matches = [c for c in available if c == name or base_name(c) == name]
        if not matches:
            unknown.append(name)
        drawn += [c for c in matches if c not in drawn]
    return drawn, unknown
