"""What the role loops share, by concern, built complete by :meth:`Wiring.build`.

- :attr:`Wiring.settings`: what the runtime reads of the config, resolved once (:mod:`~gflowdist.runtime.settings`);
- :attr:`Wiring.channels`: the protocol's data, control, weights and inference channels (:mod:`~gflowdist.runtime.channels`;
  every message is in :mod:`gflowdist.runtime.protocol`);
- :attr:`Wiring.liveness`: the stop flag, heartbeats, what the collector tells every rank, the ranks the run
  goes on without (:mod:`~gflowdist.runtime.liveness`);
- :attr:`Wiring.choices`: every choice a loop makes that depends on timing, through the
  :mod:`~gflowdist.runtime.tape` (recorded with ``--record``, made as recorded by ``gflowdist replay``);
- :attr:`Wiring.reports`: metrics, checkpoint parts and the final report to the collector, instants on the trace
  (:mod:`~gflowdist.runtime.reporting`), and on the collector's rank the collector it hosts;
- this rank's ledger, timers and generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gflowdist.comm import Communicator
from gflowdist.config import Config
from gflowdist.context import DistributedContext
from gflowdist.runtime.channels import LIMIT_KEY, Channels
from gflowdist.runtime.choices import Choices
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.liveness import Deaths, Liveness, StopFlag, collector_rank
from gflowdist.runtime.protocol import Tags
from gflowdist.runtime.reporting import Reporting
from gflowdist.runtime.settings import Settings
from gflowdist.runtime.tape import Tape
from gflowdist.timing import StepTimer
from gflowdist.timing.trace import TraceRecorder
from gflowdist.transport.channel import Channel

if TYPE_CHECKING:
    from gflowdist.runtime.checkpoints import CheckpointSaver

__all__ = ["Tags", "Wiring", "StopFlag", "LIMIT_KEY", "collector_rank"]


@dataclass(frozen=True)
class Wiring:
    """Everything a role loop needs besides its role object (the module docstring says what, by concern)."""

    context: DistributedContext
    settings: Settings
    channels: Channels
    stop: StopFlag
    liveness: Liveness
    choices: Choices
    reports: Reporting
    ledger: Ledger
    timer: StepTimer
    generation: int = 0  # resumptions so far: names this run's checkpoints

    @classmethod
    def build(
        cls,
        context: DistributedContext,
        config: Config,
        stop: StopFlag,
        *,
        ledger: Ledger | None = None,
        generation: int = 0,
        saver: CheckpointSaver | None = None,
        tape: Tape | None = None,
        trace: TraceRecorder | None = None,
        deaths: Deaths | None = None,
    ) -> Wiring:
        """The wiring of ``context``'s rank, with ``config``'s settings (resolved here, once), ``ledger`` (a
        resumed run's) and ``generation``; ``tape`` records or replays the choices, ``trace`` gets every phase,
        collective and message; ``deaths``: what this rank's process hears of deaths (its own by default)."""
        settings = Settings.of(config)
        channels = Channels.open(context.world, settings, trace)
        if trace is not None:
            stop.trace = trace
        ledger = ledger if ledger is not None else Ledger()
        timer, tape = StepTimer(trace=trace), tape or Tape()
        collector = collector_rank(context.layout)
        reports = Reporting(context, collector, channels, ledger, timer, saver)
        liveness = Liveness(
            context, channels, settings, stop, ledger, deaths or Deaths(), reports.note, replaying=tape.replaying
        )
        return cls(
            context=context,
            settings=settings,
            channels=channels,
            stop=stop,
            liveness=liveness,
            choices=Choices(tape, liveness),
            reports=reports,
            ledger=ledger,
            timer=timer,
            generation=generation,
        )

    # -- shorthands for what every loop reads -----------------------------------------------------------
    @property
    def comm(self) -> Communicator:
        """The world."""
        return self.context.world

    @property
    def rank(self) -> int:
        return self.context.world.rank

    @property
    def collector(self) -> int:
        """The rank that gathers reports (:func:`~gflowdist.runtime.liveness.collector_rank`)."""
        return self.liveness.collector

    @property
    def data(self) -> Channel:
        return self.channels.data

    @property
    def control(self) -> Channel:
        return self.channels.control

    @property
    def weights(self) -> Channel:
        return self.channels.weights

    @property
    def inference(self) -> Channel:
        return self.channels.inference

    @property
    def lost(self) -> dict[int, str]:
        """Actors the run goes on without (``faults.on_actor_loss: continue``), with why."""
        return self.liveness.lost

    @property
    def tape(self) -> Tape:
        return self.choices.tape
