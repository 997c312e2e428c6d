"""TensorBoard while a run goes: ``run.tensorboard`` writes each metrics row as it arrives.

The collector hands every row of ``metrics.jsonl`` (the trainers', the
actors' and the coordinator's own ``record()`` rows) to :class:`LiveBoard`,
which adds it to ``<run dir>/tensorboard/rank-<r>/`` as ``metrics/<name>``
at its step, and flushes the event files at least every :data:`FLUSH_S`
seconds, so ``tensorboard --logdir runs`` follows a running job. At the
run's end :func:`gflowdist.timing.tensorboard.write_tensorboard` writes the
whole set again from the run directory (the timing phases and the mean
curves with it); a run that fails keeps what was flushed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gflowdist.timing.tensorboard import TENSORBOARD_DIR

__all__ = ["LiveBoard", "FLUSH_S"]

#: Event files are flushed at least this often while rows arrive.
FLUSH_S = 3.0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class LiveBoard:
    """One ``SummaryWriter`` per rank that sends metrics, under ``run_dir/tensorboard/rank-<r>``."""

    def __init__(self, run_dir: str | Path, *, flush_s: float = FLUSH_S, clock: Callable[[], float] = time.monotonic):
        from torch.utils.tensorboard import SummaryWriter

        self._writer_class = SummaryWriter
        self.folder = Path(run_dir) / TENSORBOARD_DIR
        self.flush_s = flush_s
        self.clock = clock
        self.writers: dict[int, Any] = {}
        self._flushed = clock()

    def add(self, rank: int, row: Mapping[str, Any]) -> None:
        """A metrics row of ``rank`` (``{"step": s, name: value, ...}``); flushes when :data:`FLUSH_S` passed."""
        writer = self.writers.get(rank)
        if writer is None:
            writer = self._writer_class(log_dir=str(self.folder / f"rank-{rank}"), flush_secs=max(1, int(self.flush_s)))
            self.writers[rank] = writer
        step = int(row.get("step", 0))
        for name, value in row.items():
            if name not in ("rank", "time", "step") and _number(value):
                writer.add_scalar(f"metrics/{name}", value, step)
        if self.clock() - self._flushed >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        for writer in self.writers.values():
            writer.flush()
        self._flushed = self.clock()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers.clear()
