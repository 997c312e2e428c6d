"""Rates and ETAs for progress lines: ``Throughput`` (an EMA of items per second), ``eta_seconds``, ``format_duration``."""

from __future__ import annotations

import math
import time

from gflowdist.errors import GflowdistError
from gflowdist.timing.timers import Clock

__all__ = ["Throughput", "eta_seconds", "format_duration"]


class Throughput:
    """Exponential moving average of a rate in items per second, for progress lines.

    Each :meth:`update` with ``n`` new items at clock time ``t`` forms the
    instantaneous rate ``r = n_pending / (t - t_last)`` and folds it in::

        rate = r                               (first measurement)
        rate = alpha * r + (1 - alpha) * rate  (afterwards)

    Items reported when no time has passed (``t == t_last``) stay pending and
    join the next measurement, so no item is lost and no division by zero occurs.

    Args:
        alpha: weight of the newest measurement, in (0, 1]. 1.0 = no smoothing.
        clock: seconds callable; ``time.perf_counter`` by default.
    """

    __slots__ = ("_clock", "_last", "_pending", "_start", "alpha", "rate", "total")

    def __init__(self, alpha: float = 0.1, *, clock: Clock = time.perf_counter):
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise GflowdistError(f"Throughput alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self._clock = clock
        self._start = self._last = clock()
        self._pending = 0.0
        #: smoothed items per second; ``None`` until the first measurement
        self.rate: float | None = None
        #: all items ever reported
        self.total = 0.0

    def update(self, n: float = 1) -> float | None:
        """Report ``n`` more items done now; returns the smoothed rate (None if no time passed yet)."""
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
            raise GflowdistError(f"Throughput.update needs a count >= 0, got {n!r}")
        now = self._clock()
        self.total += n
        self._pending += n
        elapsed = now - self._last
        if elapsed <= 0.0:
            return self.rate
        instant = self._pending / elapsed
        self.rate = instant if self.rate is None else (self.alpha * instant + (1.0 - self.alpha) * self.rate)
        self._pending = 0.0
        self._last = now
        return self.rate

    def mean_rate(self) -> float | None:
        """Unsmoothed ``total / (now - start)``; None when no time has passed."""
        elapsed = self._clock() - self._start
        return self.total / elapsed if elapsed > 0.0 else None

    def eta(self, remaining: float) -> float | None:
        """Seconds to finish ``remaining`` items at the smoothed rate (see :func:`eta_seconds`)."""
        return eta_seconds(remaining, self.rate)


def eta_seconds(remaining: float, rate: float | None) -> float | None:
    """``remaining / rate`` seconds; 0.0 when nothing remains; None when the rate is unknown or 0."""
    if remaining <= 0:
        return 0.0
    if rate is None or rate <= 0.0 or not math.isfinite(rate):
        return None
    return remaining / rate


def format_duration(seconds: float | None) -> str:
    """``"1h02m03s"``, ``"4m05s"``, ``"6.2s"``; ``"?"`` for None (unknown ETA)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 60.0:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
