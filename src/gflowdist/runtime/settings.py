"""What the runtime reads of the config, resolved once: :class:`Settings`.

Every loop, the liveness and the collector read these, never the
:class:`~gflowdist.config.Config`. Every timeout the runtime waits is here, as
a named property with its multiple of ``faults.peer_timeout_s`` (or of
``faults.heartbeat_s``) written once:

| property | value | what waits it |
|---|---|---|
| ``send_timeout_s`` | max(peer_timeout_s, 1 s) | a channel's blocked send (each channel) |
| ``reply_timeout_s`` | peer_timeout_s | a buffer's answer to a sample or checkpoint |
| ``weights_timeout_s`` | peer_timeout_s | an actor waiting for its trainer's ``stop`` |
| ``refusals_wait_s`` | peer_timeout_s | a client hearing its buffer's refusals |
| ``collector_silence_s`` | peer_timeout_s | a rank declaring the collector lost |
| ``rank_silence_s`` | peer_timeout_s | the collector declaring a rank lost |
| ``silence_after_death_s`` | 3 * peer_timeout_s | the same within that time of a notice of a death |
| ``named_death_wait_s`` | 2 * peer_timeout_s | waiting for the collector to name a death; a notice's expiry |
| ``summary_every_s`` | max(heartbeat_s, 0.5 s) | a buffer's summary to the collector |
| ``postmortem_wait_s`` | min(peer_timeout_s, 10 s) | the collector gathering a post-mortem |
| ``launcher_grace_s`` | 2 * peer_timeout_s + 10 s | ``gflowdist run`` after the job's end began |
| ``keeper_bound_s`` | peer_timeout_s + 2 s | a rank's keeper after its launcher died |
| ``inference_reply_s`` | peer_timeout_s | an actor waiting for its inference rank's reply |
| ``inference_done_s`` | peer_timeout_s | an inference rank, after its trainer's stop, waiting for its actors' ``done`` |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gflowdist.config import Config, LearnerConfig, SyncConfig
from gflowdist.config.figure_choice import figure_wanted

__all__ = ["Settings", "POSTMORTEM_CAP_S", "KEEPER_MARGIN_S"]

#: The collector waits at most this long (and at most ``faults.peer_timeout_s``) for what the ranks hold.
POSTMORTEM_CAP_S = 10.0
#: How much longer than ``faults.peer_timeout_s`` a keeper lets its rank run after the launcher died (the rank's
#: own bound is ``faults.peer_timeout_s``: see :mod:`gflowdist.lifeline`).
KEEPER_MARGIN_S = 2.0
#: What ``gflowdist run`` adds to twice ``faults.peer_timeout_s`` while the job ends (a post-mortem, reports).
LAUNCHER_MARGIN_S = 10.0


@dataclass(frozen=True)
class Settings:
    """The config's values the runtime reads, resolved once by :meth:`of` (frozen: nothing changes them)."""

    # faults
    heartbeat_s: float
    peer_timeout_s: float
    startup_timeout_s: float
    checkpoint_every: int
    max_message_bytes: int
    on_nonfinite_loss: str
    on_bad_batch: str
    on_nonfinite_batch: str
    on_actor_loss: str
    max_restarts: int  # under on_actor_loss: replace, also the replacements one job may make
    # run
    steps: int
    log_every: int
    trace: bool
    tensorboard: bool
    # replay
    max_in_flight: int
    prefetch: int
    max_staleness: int | None
    replay_fraction: float
    learner_batch: int | None
    min_size_to_sample: int
    #: ``replay.sampler``'s name (``queue``: each item served once)
    sampler_name: str
    #: replayed trajectories to add to ``fresh`` ones (``replay.replay_fraction``; see ReplayConfig)
    replayed_per_step: Callable[[float | None], int]
    # report
    curves: tuple[str, ...]
    #: draw report.png (``report.figure``, or GFLOWDIST_REPORT_FIGURE where it is null)
    figure: bool
    # inference (layout.inference)
    inference_max_batch: int
    inference_max_delay_ms: float
    inference_split: int
    # the sections a component reads whole (frozen themselves)
    sync: SyncConfig
    learner: LearnerConfig

    @classmethod
    def of(cls, config: Config) -> Settings:
        """The settings of ``config``."""

        faults, run, replay = config.faults, config.run, config.replay
        return cls(
            heartbeat_s=float(faults.heartbeat_s),
            peer_timeout_s=float(faults.peer_timeout_s),
            startup_timeout_s=float(faults.startup_timeout_s),
            checkpoint_every=faults.checkpoint_every,
            max_message_bytes=faults.max_message_bytes,
            on_nonfinite_loss=faults.on_nonfinite_loss,
            on_bad_batch=faults.on_bad_batch,
            on_nonfinite_batch=faults.on_nonfinite_batch,
            on_actor_loss=faults.on_actor_loss,
            max_restarts=faults.max_restarts,
            steps=run.steps,
            log_every=run.log_every,
            trace=run.trace,
            tensorboard=run.tensorboard,
            max_in_flight=replay.max_in_flight,
            prefetch=replay.prefetch,
            max_staleness=replay.max_staleness,
            replay_fraction=replay.replay_fraction,
            learner_batch=replay.learner_batch,
            min_size_to_sample=replay.min_size_to_sample,
            sampler_name=replay.sampler_name,
            replayed_per_step=replay.replayed_per_step,
            curves=tuple(config.report.curves),
            figure=figure_wanted(config.report.figure),
            inference_max_batch=config.inference.max_batch,
            inference_max_delay_ms=float(config.inference.max_delay_ms),
            inference_split=config.inference.split,
            sync=config.sync,
            learner=config.learner,
        )

    # -- the timeouts, each with its multiplier (the table in this module's docstring) ------------------------
    @property
    def send_timeout_s(self) -> float:
        """A channel's blocked send: ``faults.peer_timeout_s``, at least 1 s."""
        return max(self.peer_timeout_s, 1.0)

    @property
    def reply_timeout_s(self) -> float:
        """A buffer's answer to a sample request or a checkpoint marker."""
        return self.peer_timeout_s

    @property
    def weights_timeout_s(self) -> float:
        """An actor waiting on its weights channel for its trainer's ``stop``."""
        return self.peer_timeout_s

    @property
    def refusals_wait_s(self) -> float:
        """A client listening for the refusals its buffer's checkpoint ack counted."""
        return self.peer_timeout_s

    @property
    def collector_silence_s(self) -> float:
        """A rank that heard nothing from the collector this long declares it lost."""
        return self.peer_timeout_s

    @property
    def rank_silence_s(self) -> float:
        """The collector declares a rank that it heard nothing from this long lost."""
        return self.peer_timeout_s

    @property
    def silence_after_death_s(self) -> float:
        """The same within this long of a notice of a death (an actor hears no beats until it is named, and the
        collector's notice may expire a little after the actor's): a notice's expiry plus ``peer_timeout_s``."""
        return self.named_death_wait_s + self.peer_timeout_s

    @property
    def named_death_wait_s(self) -> float:
        """How long a message every actor must get waits for the collector to name a dead rank; a notice of a
        death that no naming followed expires after this long (:meth:`~gflowdist.runtime.liveness.Liveness.death_unnamed`)."""
        return 2 * self.peer_timeout_s

    @property
    def summary_every_s(self) -> float:
        """A buffer's summary to the collector: once per heartbeat, at most twice a second."""
        return max(self.heartbeat_s, 0.5)

    @property
    def postmortem_wait_s(self) -> float:
        """The collector gathering what the ranks hold: ``faults.peer_timeout_s``, at most :data:`POSTMORTEM_CAP_S`."""
        return min(self.peer_timeout_s, POSTMORTEM_CAP_S)

    @property
    def launcher_grace_s(self) -> float:
        """``gflowdist run`` waiting for the job once its end began (a post-mortem, the reports)."""
        return 2 * self.peer_timeout_s + LAUNCHER_MARGIN_S

    @property
    def keeper_bound_s(self) -> float:
        """How long a rank's keeper lets it run once its launcher is gone."""
        return self.peer_timeout_s + KEEPER_MARGIN_S

    @property
    def inference_reply_s(self) -> float:
        """An actor waiting for its inference rank's answer to one request (then the inference rank is lost)."""
        return self.peer_timeout_s

    @property
    def inference_done_s(self) -> float:
        """An inference rank, once its trainer said stop, waiting for each of its actors' ``done``."""
        return self.peer_timeout_s
