"""The ``replay`` section: storage size, sampling, admission, rate limiting, flow control
(assembled with the other sections in :mod:`gflowdist.config.sections`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gflowdist.config.checks import (
    FloatCheck,
    IntCheck,
    OptionalCheck,
    StrCheck,
)
from gflowdist.config.frozen import FrozenMapping, thaw
from gflowdist.config.parts import FLAT_KEYS, PartCheck, fold_flat_keys
from gflowdist.config.section_base import Section, setting

__all__ = ["ReplayConfig"]


@dataclass(frozen=True)
class ReplayConfig(Section):
    """The replay buffers: storage size, sampling, admission, rate limiting, flow control."""

    section: ClassVar[str] = "replay"
    removed: ClassVar[dict[str, str]] = {
        "batch_size": "was removed: the replayed count now follows from replay.replay_fraction (the replayed "
        "share of each learner batch) and the rollout size; set replay_fraction instead",
    }

    capacity: int = setting(10000, IntCheck(low=1), "Trajectories each buffer rank stores.")
    sampler: Mapping[str, Any] = setting(
        "uniform",
        PartCheck("sampler"),
        "Which stored items come out when a trainer samples: a name (`uniform`, `prioritized`, `fifo`, `queue`) "
        "or `{name: prioritized, alpha: 0.6, beta: 0.4}` with that sampler's options (docs/replay.md).",
    )
    writer: Mapping[str, Any] = setting(
        "round_robin",
        PartCheck("writer"),
        "Which slot a new item takes, or whether it is admitted: `round_robin`, `keep_highest`, "
        "`dedup`, or `{name: dedup, key: terminal}`.",
    )
    min_size_to_sample: int = setting(0, IntCheck(low=0), "Sampling waits until a buffer holds this many items.")
    samples_per_insert: float | None = setting(
        None, OptionalCheck(FloatCheck(0.0, low_open=True)), "Target ratio of samples to inserts; null = no rate limit."
    )
    tolerance: float = setting(
        0.0,
        FloatCheck(0.0),
        "Allowed deviation (in samples) from `samples_per_insert` "
        "(Reverb's error_buffer); must be >= max(1, samples_per_insert) "
        "when a ratio is set.",
    )
    dedup_key: str | None = setting(
        None, OptionalCheck(StrCheck(nonempty=True)), "Old spelling of `replay.writer: {name: dedup, key: ...}`."
    )
    priority_alpha: float | None = setting(
        None, OptionalCheck(FloatCheck(0.0)), "Old spelling of `replay.sampler: {name: prioritized, alpha: ...}`."
    )
    priority_beta: float | None = setting(
        None, OptionalCheck(FloatCheck(0.0)), "Old spelling of `replay.sampler: {name: prioritized, beta: ...}`."
    )
    priority_beta_final: float | None = setting(
        None,
        OptionalCheck(FloatCheck(0.0)),
        "Old spelling of `replay.sampler: {name: prioritized, beta_final: ...}`.",
    )
    priority_beta_steps: int | None = setting(
        None,
        OptionalCheck(IntCheck(low=0)),
        "Old spelling of `replay.sampler: {name: prioritized, beta_steps: ...}`.",
    )
    replay_fraction: float = setting(
        0.5,
        FloatCheck(0.0, 1.0, high_open=True),
        "Share of each learner batch that is replayed: with F fresh "
        "trajectories a step adds round(F x f / (1 - f)) replayed ones, "
        "at least 1 (0.5: as many as fresh; 0: no replay). Below 1: "
        "every batch holds the step's fresh rollout.",
    )
    learner_batch: int | None = setting(
        None,
        OptionalCheck(IntCheck(low=1)),
        "Replayed items per step of a pure learner (a trainer "
        "whose rollout() returns None, as in Ape-X); null = such a "
        "trainer is refused.",
    )
    max_staleness: int | None = setting(
        None,
        OptionalCheck(IntCheck(low=0)),
        "Drop trajectories older than this many policy versions (at admission; a `queue` also when it serves "
        "them), counted as dropped, reason `stale`; null = keep all.",
    )
    max_in_flight: int = setting(8, IntCheck(low=1), "Unacknowledged sends a client may have outstanding.")
    prefetch: int = setting(
        1, IntCheck(low=0), "Replay batches a trainer keeps requested ahead of use; 0 = request and wait each step."
    )

    def check_together(self) -> None:
        if self.min_size_to_sample > self.capacity:
            raise self.fail(
                "min_size_to_sample",
                f"must be <= replay.capacity ({self.capacity}), found "
                f"{self.min_size_to_sample}: sampling could never start",
            )
        if self.tolerance > 0 and self.samples_per_insert is None:
            raise self.fail(
                "tolerance",
                f"only applies when replay.samples_per_insert is set, found "
                f"tolerance {self.tolerance} with samples_per_insert null",
            )
        if self.samples_per_insert is not None and self.tolerance < max(1.0, self.samples_per_insert):
            raise self.fail(
                "tolerance",
                f"must be >= max(1, samples_per_insert) = {max(1.0, self.samples_per_insert):g}, "
                f"found {self.tolerance}: a smaller window could block inserts and samples forever",
            )
        self._fold_flat_keys()
        sampler, writer = self.sampler, self.writer
        if writer["name"] == "dedup" and writer.get("key") is None:
            raise self.fail("writer", "writer 'dedup' needs its key: {name: dedup, key: <field naming a duplicate>}")
        if sampler["name"] == "prioritized":
            if sampler["beta_final"] is not None and sampler["beta_steps"] < 1:
                raise self.fail(
                    "sampler.beta_steps", f"must be >= 1 when beta_final is set, found {sampler['beta_steps']}"
                )
            if sampler["beta_final"] is None and sampler["beta_steps"]:
                raise self.fail(
                    "sampler.beta_steps",
                    f"is {sampler['beta_steps']} but beta_final is null: there is nothing to anneal towards",
                )
        if sampler["name"] == "queue" and self.learner_batch and self.capacity < self.learner_batch:
            raise self.fail(
                "capacity",
                f"is {self.capacity}, smaller than one learner batch (replay.learner_batch = "
                f"{self.learner_batch}): the queue could never serve a batch",
            )
        if sampler["name"] == "queue" and self.max_staleness is not None and self.max_staleness < self.prefetch:
            raise self.fail(
                "prefetch",
                f"is {self.prefetch}, above replay.max_staleness {self.max_staleness}: a batch asked for "
                f"{self.prefetch} steps ahead holds unrolls at least {self.prefetch} versions old when it is "
                f"learned from, so the queue would drop every one as stale; set replay.prefetch <= "
                f"{self.max_staleness}",
            )

    def _fold_flat_keys(self) -> None:
        """The old flat keys into the nested specs, checked against the registry (:func:`fold_flat_keys`)."""
        sampler, writer, flat = fold_flat_keys(self)
        object.__setattr__(self, "sampler", FrozenMapping(sampler))
        object.__setattr__(self, "writer", FrozenMapping(writer))
        for key, value in flat.items():  # reading the old keys keeps working
            object.__setattr__(self, key, value)

    @property
    def sampler_name(self) -> str:
        """The sampler's name (``replay.sampler.name``)."""
        return self.sampler["name"]

    @property
    def writer_name(self) -> str:
        """The writer's name (``replay.writer.name``)."""
        return self.writer["name"]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["sampler"], out["writer"] = thaw(self.sampler), thaw(self.writer)
        for flat in FLAT_KEYS:  # their values live in the nested specs
            out[flat] = None
        return out

    def replayed_per_step(self, fresh: float | None) -> int:
        """Replayed trajectories to add to ``fresh`` ones so that ``replay_fraction`` of the batch is replayed.

        ``round(fresh * f / (1 - f))``, at least 1 when f > 0: f = 0.5 doubles the batch,
        f = 0.2 adds a quarter (4 beside 16 fresh), f = 0 adds none. ``fresh`` None (a pure
        learner's rollout gave nothing): ``learner_batch``, 0 when that is null. A mean ``fresh``
        (the progress line's, per step over a run) may be a float.
        """
        if fresh is None:
            return self.learner_batch or 0
        if self.replay_fraction == 0:
            return 0
        return max(1, round(fresh * self.replay_fraction / (1.0 - self.replay_fraction)))
