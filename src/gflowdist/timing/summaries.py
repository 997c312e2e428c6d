r"""End-of-run summaries the report shows next to the timings: staleness, ledger, metrics.

Input formats (what the runtime hands over; plain dicts, msgpack/JSON friendly):

Staleness, per consumer rank (a trainer that learned from sampled trajectories)::

    {consumer_rank: {"0": 120, "1": 40, "3": 2}}   # staleness value (str or int) -> count

where staleness = learner policy version - version stamped on the trajectory.
Summary per consumer (``N = sum of counts``, values ``v`` ascending)::

    mean = sum(v * count_v) / N
    p_q  = min{ v : sum(count_u for u <= v) >= ceil(q * N) }   # nearest rank, q in {0.5, 0.95}
    max  = largest v with count_v > 0

Ledger, per rank (every key optional, 0 when absent; unknown keys are errors)::

    {"produced": int, "sent": int, "used_locally": int, "received": int, "admitted": int,
     "dropped": {reason: int}, "in_flight": int}

``used_locally`` counts what the producing rank consumed itself (a trainer
without a buffer learns from its own rollouts). Run-wide balance (the ledger
promise: produced = used here + delivered + dropped + in flight)::

    unaccounted = sum(produced) - (sum(used_locally) + sum(admitted) + sum(all dropped) + sum(in_flight))

``0`` means balanced. ``sent - received`` is shown beside it for the transport.

Metrics: a list of rows such as ``{"step": 10, "loss": 0.4, "l1_dist": 0.2}``.
A row's x value is ``row["step"]``, else ``row["iteration"]``, else its index.
Every other int/float value (not bool) is a metric. Non-finite values (NaN,
inf) are counted, kept as ``None`` in the curves, and skipped for first/last/best.
``best`` is the minimum when lower is better, else the maximum: lower is
better when the caller says so in ``goals`` (``{"name": "min" | "max"}``) or,
by default, when the lower-cased name contains one of :data:`LOWER_IS_BETTER`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gflowdist.errors import GflowdistError
from gflowdist.timing.timers import parse_rank

__all__ = [
    "StalenessSummary",
    "staleness_summary",
    "LedgerRow",
    "LedgerSummary",
    "ledger_summary",
    "MetricSummary",
    "metric_curves",
    "metric_summaries",
    "LEDGER_KEYS",
    "LOWER_IS_BETTER",
    "X_KEYS",
]

#: Keys of a per-rank ledger dict.
LEDGER_KEYS = ("produced", "sent", "used_locally", "received", "admitted", "dropped", "in_flight", "expired")
#: Name fragments that make a metric "lower is better" by default.
LOWER_IS_BETTER = ("loss", "err", "dist", "kl", "l1", "l2", "time", "stale", "regret")
#: Row keys used as the x axis of training curves, in order of preference.
X_KEYS = ("step", "iteration")


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GflowdistError(f"{where} must be an int >= 0, got {value!r}")
    return value


# --- staleness -------------------------------------------------------------------------


@dataclass(frozen=True)
class StalenessSummary:
    """Staleness of what one consumer learned from; ``histogram`` is ``{value: count}``."""

    histogram: Mapping[int, int]

    @property
    def count(self) -> int:
        return sum(self.histogram.values())

    @property
    def mean(self) -> float | None:
        n = self.count
        return sum(v * c for v, c in self.histogram.items()) / n if n else None

    def quantile(self, q: float) -> int | None:
        """Nearest-rank quantile: smallest v with cumulative count >= ceil(q * N)."""
        n = self.count
        if not n:
            return None
        need = max(1, math.ceil(q * n))
        seen = 0
        for value in sorted(self.histogram):
            seen += self.histogram[value]
            if seen >= need:
                return value
        raise GflowdistError(f"quantile {q!r} out of range")  # only when q > 1

    @property
    def maximum(self) -> int | None:
        present = [v for v, c in self.histogram.items() if c > 0]
        return max(present) if present else None

    def merged(self, other: StalenessSummary) -> StalenessSummary:
        """The summary of both histograms together."""
        hist = dict(self.histogram)
        for value, c in other.histogram.items():
            hist[value] = hist.get(value, 0) + c
        return StalenessSummary(hist)

    def to_dict(self) -> dict[str, int]:
        return {str(v): c for v, c in sorted(self.histogram.items())}


def staleness_summary(histogram: Mapping[Any, Any], consumer: int | str = "?") -> StalenessSummary:
    """Validate one consumer's ``{staleness (str or int): count}`` histogram."""
    if not isinstance(histogram, Mapping):
        raise GflowdistError(
            f"staleness of rank {consumer} must be a mapping {{staleness: count}}, got {type(histogram).__name__}"
        )
    hist: dict[int, int] = {}
    for key, c in histogram.items():
        if isinstance(key, bool):
            raise GflowdistError(f"staleness of rank {consumer}: bad staleness value {key!r}")
        try:
            value = int(key)
        except (TypeError, ValueError) as exc:
            raise GflowdistError(f"staleness of rank {consumer}: staleness value {key!r} is not an int") from exc
        hist[value] = hist.get(value, 0) + _count(c, f"staleness count of rank {consumer}")
    return StalenessSummary(hist)


# --- ledger ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerRow:
    """One rank's ledger (see the module docstring for the input dict)."""

    produced: int = 0
    sent: int = 0
    received: int = 0
    admitted: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    in_flight: int = 0
    #: consumed by the rank that produced them (a trainer without a buffer)
    used_locally: int = 0
    #: of ``dropped["stale"]``: admitted first, then dropped by a queue before being served (counted once)
    expired: int = 0

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "produced": self.produced,
            "sent": self.sent,
            "used_locally": self.used_locally,
            "received": self.received,
            "admitted": self.admitted,
            "dropped": dict(self.dropped),
            "in_flight": self.in_flight,
            "expired": self.expired,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], rank: int | str = "?") -> LedgerRow:
        """Validate one rank's ledger dict; absent keys are 0, unknown keys raise."""
        if not isinstance(data, Mapping):
            raise GflowdistError(f"ledger of rank {rank} must be a mapping, got {type(data).__name__}")
        unknown = set(data) - set(LEDGER_KEYS)
        if unknown:
            raise GflowdistError(
                f"ledger of rank {rank} has unknown keys {sorted(map(str, unknown))}; known: {list(LEDGER_KEYS)}"
            )
        dropped = data.get("dropped", {})
        if not isinstance(dropped, Mapping):
            raise GflowdistError(
                f"ledger of rank {rank}: 'dropped' must be {{reason: count}}, got {type(dropped).__name__}"
            )
        return cls(
            **{
                k: _count(data.get(k, 0), f"ledger of rank {rank}: {k!r}")
                for k in ("produced", "sent", "used_locally", "received", "admitted", "in_flight", "expired")
            },
            dropped={
                str(reason): _count(n, f"ledger of rank {rank}: dropped[{reason!r}]") for reason, n in dropped.items()
            },
        )


@dataclass(frozen=True)
class LedgerSummary:
    """Every rank's ledger and their sum; ``unaccounted == 0`` means balanced."""

    rows: Mapping[int, LedgerRow]

    @property
    def reasons(self) -> list[str]:
        """Every drop reason any rank reported, sorted."""
        return sorted({reason for row in self.rows.values() for reason in row.dropped})

    @property
    def total(self) -> LedgerRow:
        dropped: dict[str, int] = {}
        for row in self.rows.values():
            for reason, n in row.dropped.items():
                dropped[reason] = dropped.get(reason, 0) + n
        return LedgerRow(
            produced=sum(r.produced for r in self.rows.values()),
            sent=sum(r.sent for r in self.rows.values()),
            received=sum(r.received for r in self.rows.values()),
            admitted=sum(r.admitted for r in self.rows.values()),
            dropped=dropped,
            in_flight=sum(r.in_flight for r in self.rows.values()),
            used_locally=sum(r.used_locally for r in self.rows.values()),
            expired=sum(r.expired for r in self.rows.values()),
        )

    @property
    def unaccounted(self) -> int:
        """``produced - (used_locally + admitted + dropped - expired + in_flight)`` summed over ranks
        (an expired item was admitted, then dropped: counted once)."""
        t = self.total
        return t.produced - (t.used_locally + t.admitted + t.dropped_total - t.expired + t.in_flight)

    @property
    def balanced(self) -> bool:
        return self.unaccounted == 0

    def balance_line(self) -> str:
        t = self.total
        verdict = "balanced" if self.balanced else (f"UNBALANCED: {self.unaccounted:+d} trajectories unaccounted for")
        used = f"used here {t.used_locally} + " if t.used_locally else ""
        expired = f" - expired {t.expired} (admitted, then dropped: stale, unlearned)" if t.expired else ""
        return (
            f"balance: produced {t.produced} = {used}admitted {t.admitted} + dropped "
            f"{t.dropped_total}{expired} + in flight {t.in_flight} -> {verdict}; "
            f"sent {t.sent} - received {t.received} = {t.sent - t.received}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {str(rank): row.to_dict() for rank, row in sorted(self.rows.items())}


def ledger_summary(ledger: Mapping[Any, Mapping[str, Any]]) -> LedgerSummary:
    """Validate ``{rank: ledger dict}`` (rank keys int or str)."""
    rows = {parse_rank(rank, "ledger"): LedgerRow.from_dict(data, rank) for rank, data in ledger.items()}
    return LedgerSummary(dict(sorted(rows.items())))


# --- training curves -------------------------------------------------------------------


@dataclass(frozen=True)
class MetricSummary:
    """First, last and best finite value of one metric, with the x (step) of each."""

    name: str
    goal: str  # "min" or "max": which extreme is best
    count: int  # rows that had the metric
    nonfinite: int  # of which NaN/inf
    first: tuple[float, float] | None  # (x, value)
    last: tuple[float, float] | None
    best: tuple[float, float] | None

    def to_dict(self) -> dict[str, Any]:
        def pair(p: tuple[float, float] | None) -> list[float] | None:
            return None if p is None else [p[0], p[1]]

        return {
            "name": self.name,
            "goal": self.goal,
            "count": self.count,
            "nonfinite": self.nonfinite,
            "first": pair(self.first),
            "last": pair(self.last),
            "best": pair(self.best),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricSummary:
        def pair(p: Sequence[float] | None) -> tuple[float, float] | None:
            return None if p is None else (p[0], p[1])

        return cls(
            str(data["name"]),
            str(data["goal"]),
            int(data["count"]),
            int(data["nonfinite"]),
            pair(data["first"]),
            pair(data["last"]),
            pair(data["best"]),
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def metric_curves(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list[Any]]]:
    """``{metric: {"x": [...], "y": [...]}}``; non-finite y values become ``None``."""
    curves: dict[str, dict[str, list[Any]]] = {}
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise GflowdistError(f"metrics row {index} must be a mapping, got {type(row).__name__}")
        x_key = next((k for k in X_KEYS if k in row), None)
        x = row[x_key] if x_key is not None else index
        if not _is_number(x):
            raise GflowdistError(f"metrics row {index}: {x_key!r} must be a number, got {x!r}")
        for name, value in row.items():
            if name in X_KEYS or not _is_number(value):
                continue
            curve = curves.setdefault(str(name), {"x": [], "y": []})
            curve["x"].append(x)
            curve["y"].append(value if math.isfinite(value) else None)
    return curves


def _goal(name: str, goals: Mapping[str, str] | None) -> str:
    if goals and name in goals:
        goal = goals[name]
        if goal not in ("min", "max"):
            raise GflowdistError(f"goal of metric {name!r} must be 'min' or 'max', got {goal!r}")
        return goal
    lowered = name.lower()
    return "min" if any(frag in lowered for frag in LOWER_IS_BETTER) else "max"


def metric_summaries(
    curves: Mapping[str, Mapping[str, Sequence[Any]]], goals: Mapping[str, str] | None = None
) -> list[MetricSummary]:
    """One :class:`MetricSummary` per curve of :func:`metric_curves`, in curve order."""
    out = []
    for name, curve in curves.items():
        points = [(x, y) for x, y in zip(curve["x"], curve["y"], strict=False) if y is not None]
        goal = _goal(name, goals)
        best = None
        if points:
            pick = min if goal == "min" else max
            best = pick(points, key=lambda p: p[1])  # first occurrence of the extreme
        out.append(
            MetricSummary(
                name,
                goal,
                len(curve["y"]),
                len(curve["y"]) - len(points),
                points[0] if points else None,
                points[-1] if points else None,
                best,
            )
        )
    return out
