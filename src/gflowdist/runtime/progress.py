"""The progress line the collector prints while a run goes: steps, rate, metrics, ETA, flooding.

::

    step 361/600  trajectories/s 768  loss 0.01699  l1 0.1631  modes 4/4  eta 18.3s

- ``step``: the slowest trainer's steps done, of ``run.steps``.
- ``<unit>/s``: what the producers made in *this generation* (since the
  collector started; after ``--resume`` the counts a rank had at the resume are
  its baseline), per second. The unit is the producing role class's
  :attr:`~gflowdist.runtime.roles.Actor.unit` (``trajectories``;
  ``transitions`` for :class:`~gflowdist.rl.EnvironmentActor`).
- metrics: the newest value of each trainer's and actor's metric (ints summed
  over ranks, floats averaged), then the coordinator's ``progress_fields()``.
- ``eta``: ``(run.steps - step) x seconds per step of this generation``; ``?``
  until a step of this generation is done.
- ``flooding``: shown when actors outrun the learners (:func:`flood`).

In a terminal the line is rewritten in place (``\\r``, erased to the end,
cut to the terminal's width) every 0.5 s; elsewhere a new line every 5 s.
``gflowdist run`` tells the ranks whether its own stdout is a terminal and
how wide (:data:`~gflowdist.jobenv.CONSOLE_VARIABLE`): under mpiexec a rank's
stdout is a pipe to mpiexec even when mpiexec writes to a terminal.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from gflowdist.jobenv import CONSOLE_VARIABLE
from gflowdist.timing import eta_seconds, format_duration

if TYPE_CHECKING:
    from gflowdist.config import Config
    from gflowdist.layout import Layout
    from gflowdist.runtime.wiring import Wiring

__all__ = ["ProgressLine", "Flood", "flood", "console_of", "progress_line", "FLOOD_FACTOR", "FLOOD_MIN_STEPS"]

#: Actors' items per learner step at least this many times what the learners replay per step: flooding.
FLOOD_FACTOR = 10.0
#: Learner steps of the generation before flooding is judged (the first ones wait for min_size_to_sample).
FLOOD_MIN_STEPS = 5
#: Seconds between lines: rewritten in place in a terminal, new lines elsewhere.
TTY_INTERVAL_S = 0.5
PIPE_INTERVAL_S = 5.0


def console_of(out: TextIO) -> tuple[bool, int]:
    """``(is a terminal, columns)`` of the console the run's lines reach.

    ``out`` itself when it is a terminal; else what the launcher said of its own stdout in
    :data:`~gflowdist.jobenv.CONSOLE_VARIABLE` (``tty:COLUMNS`` or ``pipe``).
    """
    told = os.environ.get(CONSOLE_VARIABLE, "")
    kind, _, columns = told.partition(":")
    width = int(columns) if columns.isdigit() and int(columns) > 20 else 100
    try:
        own = out.isatty()
    except (AttributeError, ValueError):
        own = False
    if own:
        try:
            width = os.get_terminal_size(out.fileno()).columns
        except (AttributeError, OSError, ValueError):
            pass
        return True, width
    return kind == "tty", width


@dataclass(frozen=True)
class Flood:
    """Actors outran the learners: ``per_step`` items admitted per learner step against ``replayed`` replayed."""

    per_step: float
    replayed: float
    unit: str
    setting: str

    @property
    def factor(self) -> float:
        return self.per_step / self.replayed

    def field(self) -> str:
        """The progress line's ``flooding`` field."""
        return f"{self.factor:.0f}x (pace with {self.setting.split(' (')[0].split(',')[0]})"

    def note(self) -> str:
        """The report's note."""
        return (
            f"actors flooded the learners: {self.per_step:.0f} {self.unit} admitted per learner step, "
            f"{self.replayed:.0f} replayed per step ({self.factor:.0f}x): most of what they produced was never "
            f"learned from; pace them with {self.setting}"
        )


def flood(actor_items: float, learner_steps: int, replayed_per_step: float, *, unit: str, setting: str) -> Flood | None:
    """A :class:`Flood` when ``actor_items / learner_steps >= FLOOD_FACTOR x replayed_per_step``, else None.

    ``actor_items``: what the actors produced in the generation beyond what the buffers held before the
    learners could start (``replay.min_size_to_sample``); ``replayed_per_step``: over every trainer.
    """
    if learner_steps < FLOOD_MIN_STEPS or replayed_per_step <= 0 or actor_items <= 0:
        return None
    per_step = actor_items / learner_steps
    if per_step < FLOOD_FACTOR * replayed_per_step:
        return None
    return Flood(per_step, replayed_per_step, unit, setting)


class ProgressLine:
    """What the collector needs to print the progress line (see the module docstring)."""

    def __init__(
        self,
        out: TextIO,
        *,
        total_steps: int,
        start_step: int,
        generation: int,
        unit: str,
        trainers: list[int],
        actors: list[int],
        replayed_per_step: Callable[[float | None], float],
        pace_setting: str,
        unused_items: int = 0,
        clock: Callable[[], float] = time.monotonic,
        console: tuple[bool, int] | None = None,
    ):
        self.out = out
        self.total_steps = total_steps
        self.start_step = start_step
        self.generation = generation
        self.unit = unit
        self.trainers = set(trainers)
        self.actors = set(actors)
        self.replayed_per_step = replayed_per_step
        self.pace_setting = pace_setting
        self.unused_items = unused_items
        self.clock = clock
        self.started = clock()
        self.tty, self.columns = console_of(out) if console is None else console
        self.interval = TTY_INTERVAL_S if self.tty else PIPE_INTERVAL_S
        self.baseline: dict[int, int] = {}  # rank -> its count when this generation began
        self.counts: dict[int, int] = {}  # rank -> its newest count (heartbeats and metrics rows)
        self.last_flood: Flood | None = None
        self._last_print = float("-inf")
        self._open = False  # a line in place is on the console, not yet ended

    def heard(self, rank: int, produced: int) -> None:
        """``rank`` has produced ``produced`` items in all (its heartbeat or metrics row says so).

        The first count heard from a rank in a resumed generation is its baseline (generation 0: 0).
        """
        if rank not in self.baseline:
            self.baseline[rank] = produced if self.generation else 0
        self.counts[rank] = max(self.counts.get(rank, 0), produced)

    def made(self) -> dict[int, int]:
        """``{rank: items made in this generation}``."""
        return {rank: max(0, count - self.baseline[rank]) for rank, count in self.counts.items()}

    def fields(self, latest: Mapping[int, Mapping[str, Any]], extra: Mapping[str, str]) -> dict[str, str]:
        """The line's fields, from each rank's newest metrics ``latest`` and the extra fields."""
        now = self.clock()
        elapsed = max(now - self.started, 1e-9)
        steps = [m.get("step", 0) + 1 for rank, m in latest.items() if rank in self.trainers] or [self.start_step]
        step = min(steps)
        for rank, m in latest.items():
            if isinstance(m.get("trajectories"), int):
                self.heard(rank, m["trajectories"])
        made = self.made()
        fields = {
            **({"gen": str(self.generation)} if self.generation else {}),
            "step": f"{step}/{self.total_steps}",
            f"{self.unit}/s": f"{sum(made.values()) / elapsed:.0f}",
        }
        values: dict[str, list[int | float]] = {}
        for m in latest.values():
            for key, value in m.items():
                if (
                    key not in ("step", "trajectories")
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):
                    values.setdefault(key, []).append(value)
        for key, vs in values.items():  # ints are counts: summed over ranks; floats averaged
            counts = all(type(v) is int for v in vs)
            fields[key] = f"{sum(vs)}" if counts else f"{sum(vs) / len(vs):.4g}"
        fields.update(extra)
        done = step - self.start_step
        self.last_flood = self._flood(latest, made, done)
        if self.last_flood is not None:
            fields["flooding"] = self.last_flood.field()
        rate = done / elapsed if done > 0 else 0.0
        fields["eta"] = format_duration(eta_seconds(self.total_steps - step, rate))
        return fields

    def _flood(self, latest: Mapping[int, Mapping[str, Any]], made: Mapping[int, int], done: int) -> Flood | None:
        if not self.actors or done <= 0:
            return None
        actor_items = sum(n for rank, n in made.items() if rank in self.actors) - self.unused_items
        replayed = 0.0
        for rank in self.trainers:
            fresh = made.get(rank, 0) / done
            replayed += self.replayed_per_step(fresh or None)
        return flood(actor_items, done, replayed, unit=self.unit, setting=self.pace_setting)

    def due(self, force: bool = False) -> bool:
        """Time for a line (or ``force``)."""
        now = self.clock()
        if not force and now - self._last_print < self.interval:
            return False
        self._last_print = now
        return True

    def write(self, fields: Mapping[str, str]) -> None:
        line = "  ".join(f"{k} {v}" for k, v in fields.items())
        if self.tty:
            self.out.write("\r\x1b[2K" + line[: max(self.columns - 1, 20)])
            self._open = True
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def say(self, line: str) -> None:
        """A line of the collector's own while the run goes on (a rank lost or replaced), on a line of its own:
        the progress line left in place (a terminal) is ended first, and its next update starts below. Written
        straight after it, that line was glued to the progress (``... modesgflowdist: lost rank 2 ...``)."""
        self.finish()
        self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        """End a line left in place (a terminal), so what follows starts on a line of its own."""
        if self._open:
            self.out.write("\n")
            self.out.flush()
            self._open = False


def producer_class(config: Config, layout: Layout) -> type | None:
    """The class whose items the run counts: the actors' when there are actors, else the trainers'."""
    from gflowdist.errors import ConfigError

    role = "actor" if layout.actors else "trainer"
    try:
        return config.role_class(role)
    except ConfigError:  # the job itself reports a class that does not load, with its own words
        return None


def progress_line(w: Wiring, out: TextIO, *, start_step: int = 0, producer: type | None = None) -> ProgressLine:
    """The :class:`ProgressLine` of the job ``w`` (a :class:`~gflowdist.runtime.wiring.Wiring`) wires;
    ``producer``: the class whose items it counts (:func:`producer_class`)."""
    settings, layout, cls = w.settings, w.context.layout, producer
    return ProgressLine(
        out,
        total_steps=settings.steps,
        start_step=start_step,
        generation=w.generation,
        unit=str(getattr(cls, "unit", "trajectories")),
        trainers=list(layout.trainers),
        actors=list(layout.actors),
        replayed_per_step=settings.replayed_per_step,
        pace_setting=str(getattr(cls, "pace_setting", "replay.samples_per_insert")),
        unused_items=settings.min_size_to_sample * max(len(layout.buffers), 1),
    )
