"""When sampling and inserting may proceed: Reverb's SampleToInsertRatio rule.

The limiter counts ``inserts`` (items admitted), ``samples`` (items served)
and ``deletes`` (items that left the storage: evicted or consumed), so the
buffer holds ``size = inserts - deletes`` items. With ``SPI =
samples_per_insert``, ``m = min_size_to_sample`` and ``T = tolerance``::

    diff     = inserts * SPI - samples
    min_diff = m * SPI - T
    max_diff = m * SPI + T

    can_sample(n):  size >= m  and  diff - n >= min_diff
    can_insert(n):  size + n <= m  or  diff + n * SPI <= max_diff

Stage 1 (``size < m``): inserts are free, samples wait. Stage 2: the limiter
keeps ``diff`` in ``[min_diff, max_diff]``, i.e. the error of the ratio
``(inserts - m) * SPI - samples`` stays within ``[-T, +T]``: the offset
``m * SPI`` means the first ``m`` items are not owed any samples. This is
exactly Reverb's ``RateLimiter::CanSample``/``CanInsert`` with
``error_buffer = T``.

With ``samples_per_insert=None`` only the minimum size applies (Reverb's
``MinSize``): ``can_sample(n) = size >= m``, inserts are never limited.

Validation (:class:`~gflowdist.errors.ConfigError`): Reverb's rule
``T >= max(1, SPI)``, otherwise a single insert or sample can step over the
whole window and block calls forever. For batches, sampling ``n`` at once
needs ``n <= 2T`` and inserting ``k`` at once needs ``k * SPI <= 2T``; a call
that is blocked and could never pass raises instead of returning False, and
:meth:`RateLimiter.check_batch_sizes` checks the deadlock-free condition
``2T >= n + k * SPI`` up front.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from gflowdist.errors import ConfigError, DeadlineError

__all__ = ["RateLimiter", "wait_until"]


def wait_until(
    ready: Callable[[], bool],
    *,
    what: str,
    timeout: float,
    progress: Callable[[], object] | None = None,
    poll_interval: float = 0.001,
    why_blocked: Callable[[], str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Call ``progress`` until ``ready()`` holds; raise ``DeadlineError`` after ``timeout`` s.

    Each round: return if ``ready()``; raise if the deadline passed; call
    ``progress()`` (e.g. receive and insert pending trajectories); return if
    ``ready()``; otherwise sleep ``poll_interval`` (never past the deadline),
    so an idle wait does not spin a core.
    """
    if not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
    deadline = clock() + timeout
    while not ready():
        now = clock()
        if now >= deadline:
            reason = f": {why_blocked()}" if why_blocked is not None else ""
            raise DeadlineError(f"could not {what} within {timeout:g} s{reason}")
        if progress is not None:
            progress()
            if ready():
                return
        sleep(max(0.0, min(poll_interval, deadline - clock())))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class RateLimiter:
    """Blocks sampling below a minimum size and keeps samples per insert in a window.

    Args:
        min_size_to_sample: ``m``; sampling waits until the buffer holds ``m`` items.
        samples_per_insert: ``SPI``, the average number of times each item
            is sampled; ``None`` for no ratio.
        tolerance: ``T``, the allowed error of ``inserts * SPI - samples``
            around its offset ``m * SPI`` (needs ``SPI``; ``None`` or ``0``
            without it).
    """

    def __init__(
        self, min_size_to_sample: int = 1, samples_per_insert: float | None = None, tolerance: float | None = None
    ):
        if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int) or min_size_to_sample < 0:
            raise ConfigError(f"must be an integer >= 0, found {min_size_to_sample!r}", key="replay.min_size_to_sample")
        if samples_per_insert is None:
            if tolerance not in (None, 0, 0.0):
                raise ConfigError(
                    f"only applies when replay.samples_per_insert is set, found "
                    f"tolerance {tolerance!r} with samples_per_insert null",
                    key="replay.tolerance",
                )
        else:
            if not (_number(samples_per_insert) and samples_per_insert > 0):
                raise ConfigError(
                    f"must be a finite number > 0 or null, found {samples_per_insert!r}",
                    key="replay.samples_per_insert",
                )
            floor = max(1.0, float(samples_per_insert))
            if not (_number(tolerance) and tolerance is not None and tolerance >= floor):
                raise ConfigError(
                    f"must be >= max(1, samples_per_insert) = {floor:g}, found {tolerance!r}: "
                    f"a smaller window would block sample and/or insert calls forever "
                    f"(one insert moves inserts*SPI - samples by {samples_per_insert:g}, "
                    f"one sample by 1)",
                    key="replay.tolerance",
                )
        self.min_size_to_sample = min_size_to_sample
        self.samples_per_insert = None if samples_per_insert is None else float(samples_per_insert)
        self.tolerance = 0.0 if tolerance is None else float(tolerance)
        self.inserts = 0
        self.samples = 0
        self.deletes = 0

    # -- the rule -------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.inserts - self.deletes

    @property
    def diff(self) -> float:
        """``inserts * SPI - samples`` (0 without a ratio)."""
        if self.samples_per_insert is None:
            return 0.0
        return self.inserts * self.samples_per_insert - self.samples

    @property
    def window(self) -> tuple[float, float]:
        """``(min_diff, max_diff)``; infinite without a ratio."""
        if self.samples_per_insert is None:
            return (-math.inf, math.inf)
        offset = self.min_size_to_sample * self.samples_per_insert
        return (offset - self.tolerance, offset + self.tolerance)

    def can_sample(self, n: int) -> bool:
        """Whether ``n`` items may be sampled now (see the module docstring).

        Raises ``ConfigError`` when blocked and ``n > 2 * tolerance``: such a
        sample would block sample calls forever.
        """
        _check_count(n, "sample")
        if self.size < self.min_size_to_sample:
            return False
        if self.samples_per_insert is None or self.diff - n >= self.window[0]:
            return True
        if n > 2 * self.tolerance:
            raise ConfigError(
                f"a sample of {n} items needs a window 2*tolerance >= {n}, found "
                f"tolerance {self.tolerance:g}: it would block sample calls forever",
                key="replay.tolerance",
            )
        return False

    def can_insert(self, n: int) -> bool:
        """Whether ``n`` items may be inserted now (see the module docstring).

        Raises ``ConfigError`` when blocked and ``n * SPI > 2 * tolerance``:
        such an insert would block insert calls forever.
        """
        _check_count(n, "insert")
        if self.samples_per_insert is None or self.size + n <= self.min_size_to_sample:
            return True
        if self.diff + n * self.samples_per_insert <= self.window[1]:
            return True
        if n * self.samples_per_insert > 2 * self.tolerance:
            raise ConfigError(
                f"an insert of {n} items moves inserts*SPI - samples by "
                f"{n * self.samples_per_insert:g}, more than the window 2*tolerance = "
                f"{2 * self.tolerance:g}: it would block insert calls forever",
                key="replay.tolerance",
            )
        return False

    def check_batch_sizes(self, sample_batch: int, insert_batch: int) -> None:
        """Raise ``ConfigError`` unless ``2T >= sample_batch + insert_batch * SPI``.

        Below that bound there are values of ``diff`` at which neither a
        sample of ``sample_batch`` nor an insert of ``insert_batch`` may
        proceed: a single-threaded loop would block forever.
        """
        _check_count(sample_batch, "sample")
        _check_count(insert_batch, "insert")
        if self.samples_per_insert is None:
            return
        need = sample_batch + insert_batch * self.samples_per_insert
        if 2 * self.tolerance < need:
            raise ConfigError(
                f"must be >= (sample batch {sample_batch} + insert batch {insert_batch} "
                f"* samples_per_insert {self.samples_per_insert:g}) / 2 = {need / 2:g}, "
                f"found {self.tolerance:g}: otherwise both sample and insert calls can "
                f"block forever",
                key="replay.tolerance",
            )

    def why_sample_blocked(self, n: int) -> str:
        if self.size < self.min_size_to_sample:
            return f"the buffer holds {self.size} < min_size_to_sample {self.min_size_to_sample}"
        return (
            f"samples would outrun inserts: inserts*SPI - samples - n = {self.diff - n:g} < min_diff {self.window[0]:g}"
        )

    def why_insert_blocked(self, n: int) -> str:
        return (
            f"inserts would outrun samples: inserts*SPI - samples + n*SPI = "
            f"{self.diff + n * (self.samples_per_insert or 0.0):g} > "
            f"max_diff {self.window[1]:g}"
        )

    # -- bookkeeping ----------------------------------------------------------

    def record_insert(self, n: int) -> None:
        self.inserts += n

    def record_sample(self, n: int) -> None:
        self.samples += n

    def record_delete(self, n: int) -> None:
        self.deletes += n

    def wait_until_can_sample(
        self, n: int, *, timeout: float, progress: Callable[[], object] | None = None, poll_interval: float = 0.001
    ) -> None:
        """Call ``progress`` until ``can_sample(n)``; ``DeadlineError`` after ``timeout`` s."""
        wait_until(
            lambda: self.can_sample(n),
            what=f"sample {n} items",
            timeout=timeout,
            progress=progress,
            poll_interval=poll_interval,
            why_blocked=lambda: self.why_sample_blocked(n),
        )

    def wait_until_can_insert(
        self, n: int, *, timeout: float, progress: Callable[[], object] | None = None, poll_interval: float = 0.001
    ) -> None:
        """Call ``progress`` until ``can_insert(n)``; ``DeadlineError`` after ``timeout`` s."""
        wait_until(
            lambda: self.can_insert(n),
            what=f"insert {n} items",
            timeout=timeout,
            progress=progress,
            poll_interval=poll_interval,
            why_blocked=lambda: self.why_insert_blocked(n),
        )

    # -- checkpoint -----------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        low, high = self.window
        return {
            "inserts": self.inserts,
            "samples": self.samples,
            "deletes": self.deletes,
            "diff": self.diff,
            "min_diff": low,
            "max_diff": high,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters and settings; loading keeps this limiter's settings, restores counters."""
        return {
            "min_size_to_sample": self.min_size_to_sample,
            "samples_per_insert": self.samples_per_insert,
            "tolerance": self.tolerance,
            "inserts": self.inserts,
            "samples": self.samples,
            "deletes": self.deletes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inserts = int(state["inserts"])
        self.samples = int(state["samples"])
        self.deletes = int(state["deletes"])


def _check_count(n: Any, what: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of items to {what} must be a positive int, got {n!r}")
