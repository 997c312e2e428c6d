"""The sections of a configuration: one frozen dataclass each, every field a :func:`setting`.

Each field carries ``metadata["check"]`` (a :class:`~gflowdist.config.checks.Check`)
and ``metadata["doc"]`` (one sentence for the reference table in
``docs/configuration.md``); a section runs its field checks, then its
cross-field checks, when it is constructed. :class:`~gflowdist.config.schema.Config`
puts the sections together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gflowdist.config.checks import (
    BoolCheck,
    ChoiceCheck,
    ClassRefCheck,
    CountCheck,
    DevicesCheck,
    FloatCheck,
    IntCheck,
    ModuleListCheck,
    OptionalCheck,
    StrCheck,
    StrListCheck,
)
from gflowdist.config.replay_section import ReplayConfig
from gflowdist.config.section_base import MIB, REST, Section, setting
from gflowdist.engines import CHOICES

#: ``launch.warm_imports`` when a config does not say: what torch's optimizers import at their first step
WARM_IMPORTS_DEFAULT = ("torch._dynamo",)

__all__ = [
    "RunConfig",
    "LaunchConfig",
    "LayoutConfig",
    "RolesConfig",
    "ReplayConfig",
    "SyncConfig",
    "LearnerConfig",
    "FaultsConfig",
    "ReportConfig",
    "InferenceConfig",
    "SECTIONS",
    "REST",
    "MIB",
    "ACTOR_LOSS_REFUSED",
    "WARM_IMPORTS_DEFAULT",
    "setting",
]


@dataclass(frozen=True)
class RunConfig(Section):
    """What the run is called, how long it lasts, where its files go."""

    section: ClassVar[str] = "run"

    name: str = setting(
        "run", StrCheck(name_like=True), "Run name; each run's files go to `<out_dir>/<name>-<timestamp>/`."
    )
    seed: int = setting(0, IntCheck(low=0), "Run seed; every rank's seed is derived from it.")
    steps: int = setting(100, IntCheck(low=1), "Training steps per trainer.")
    out_dir: str = setting(
        "runs", StrCheck(nonempty=True), "Directory for run outputs (logs, checkpoints, timing reports)."
    )
    log_every: int = setting(10, IntCheck(low=1), "Log metrics every this many steps.")
    tensorboard: bool = setting(
        False,
        BoolCheck(),
        "Also write TensorBoard event files (every metric per rank and averaged, "
        "every timing phase) into the run directory's tensorboard/ at the end; "
        "needs pip install 'gflowdist[tensorboard]'.",
    )
    trace: bool = setting(
        True,
        BoolCheck(),
        "Write trace.json, every rank's timeline (phases, collectives, messages as arrows) in "
        "the Chrome trace format, into the run directory; see docs/trace-replay.md.",
    )
    trace_events: int = setting(
        20_000,
        IntCheck(low=1),
        "Events each rank keeps for trace.json: a ring, the newest ones; the trace then "
        "covers the stretch of time every rank still holds.",
    )
    record: bool = setting(
        False,
        BoolCheck(),
        "Record every choice of every rank that depends on timing into record/ in the run "
        "directory, for gflowdist replay (gflowdist run --record).",
    )
    replay_of: str | None = setting(
        None,
        OptionalCheck(StrCheck(nonempty=True)),
        "Set by gflowdist replay: the recorded run directory whose choices every rank makes again.",
    )

    def check_together(self) -> None:
        if self.record and self.replay_of is not None:
            raise self.fail("record", "a replay (run.replay_of) cannot record itself: set run.record=false")


@dataclass(frozen=True)
class LaunchConfig(Section):
    """How `gflowdist run` starts the job."""

    section: ClassVar[str] = "launch"

    engine: str = setting(
        "auto",
        ChoiceCheck(*CHOICES),
        "Communication engine: mpi4py, torch.distributed, local (every rank a thread of one process, "
        "for debugging), or auto (the job's own launcher decides).",
    )
    nprocs: int = setting(4, IntCheck(low=1), "Number of ranks to start when gflowdist launches the job itself.")
    mpiexec: str | None = setting(
        None,
        OptionalCheck(StrCheck(nonempty=True)),
        "Path of the site's mpiexec; null = the one the environment "
        "variable GFLOWDIST_MPIEXEC names, else the one next to "
        "sys.executable, else the one on PATH.",
    )
    mpiexec_args: tuple[str, ...] = setting((), StrListCheck(), "Extra arguments passed to mpiexec before the program.")
    warm_start: bool | None = setting(
        None,
        OptionalCheck(BoolCheck()),
        "Start the ranks on the launcher's host as forks of one process that imported torch once (the warm "
        "parent; docs/runtime.md#warm-start): less CPU and memory, one serial import. true; false; null = "
        "when there are more ranks than the launcher's usable cores.",
    )
    warm_imports: tuple[str, ...] = setting(
        WARM_IMPORTS_DEFAULT,
        ModuleListCheck(),
        "What the warm parent imports besides torch and the runtime, once for every rank it forks: torch's "
        "optimizers import torch._dynamo at their first step (about 1-2 CPU-s a rank); add your ranks' heavy "
        "imports (gymnasium, ...); [] where no rank steps a torch optimizer.",
    )
    devices: str | tuple[str, ...] = setting(
        "auto",
        DevicesCheck(),
        "Each rank's device: auto = cuda:<local rank mod visible "
        "GPUs> (cpu without GPUs); cpu; cuda (auto, but no GPU is an "
        "error); or a list [cuda:0, cuda:1, cpu] indexed by local rank "
        "(cycled). See docs/cluster.md#gpus.",
    )


@dataclass(frozen=True)
class LayoutConfig(Section):
    """Which rank does what; see docs/layout.md for the arithmetic."""

    section: ClassVar[str] = "layout"

    trainers: int | str = setting(REST, CountCheck(), "Trainer ranks (sample and learn).")
    actors: int | str = setting(0, CountCheck(), "Actor ranks (sample only, get weights from a trainer).")
    buffers: int | str = setting(
        1, CountCheck(), "Replay-buffer ranks; each serves the trainers and actors assigned to it."
    )
    coordinator: bool = setting(True, BoolCheck(), "Whether the last rank is a coordinator.")
    inference: int = setting(
        0,
        IntCheck(low=0),
        "Inference ranks (placed before the coordinator): each runs the policy of its share of the actors, "
        "batched across them (section `inference`); the trainer's weights go to them, not to the actors.",
    )
    agent_groups: int = setting(
        1,
        IntCheck(low=1),
        "Number of agent groups; the trainers are split into this many equal groups that average among themselves.",
    )
    placement: str = setting(
        "block",
        ChoiceCheck("block", "node-local"),
        "Rank placement rule: block (torchgfn's arithmetic) or node-local (buffers on their clients' host).",
    )

    def check_together(self) -> None:
        rest = [name for name in ("trainers", "actors", "buffers") if getattr(self, name) == REST]
        if len(rest) > 1:
            raise self.fail(
                rest[1],
                f"at most one count may be 'rest', but {' and '.join(rest)} both are; give the others as numbers",
            )

    def counts(self) -> dict[str, int | str]:
        """``{"trainers": ..., "actors": ..., "buffers": ...}`` as configured (ints or "rest")."""
        return {"trainers": self.trainers, "actors": self.actors, "buffers": self.buffers}


@dataclass(frozen=True)
class RolesConfig(Section):
    """The user's classes for each role; null = the framework default class."""

    section: ClassVar[str] = "roles"

    trainer: str | None = setting(None, OptionalCheck(ClassRefCheck()), "Trainer class.")
    actor: str | None = setting(None, OptionalCheck(ClassRefCheck()), "Actor class.")
    buffer: str | None = setting(None, OptionalCheck(ClassRefCheck()), "Buffer-manager class.")
    coordinator: str | None = setting(None, OptionalCheck(ClassRefCheck()), "Coordinator class.")


@dataclass(frozen=True)
class SyncConfig(Section):
    """How trainers agree on weights, and how actors get them."""

    section: ClassVar[str] = "sync"

    mode: str = setting(
        "gradients",
        ChoiceCheck("gradients", "models", "none"),
        "Within an agent group: average gradients every step, average model weights every `every` steps "
        "(in between, a trainer may run up to a step ahead of the slowest), or nothing.",
    )
    every: int = setting(1, IntCheck(low=1), "For mode models: average the weights every this many steps.")
    weights_to_actors_every: int = setting(
        1, IntCheck(low=1), "A trainer sends its weights to its actors every this many steps."
    )
    weights_to_coordinator_every: int = setting(
        0,
        IntCheck(low=0),
        "The first trainer sends its weights to the "
        "coordinator (Coordinator.on_weights) every this "
        "many steps; 0 = never.",
    )


@dataclass(frozen=True)
class LearnerConfig(Section):
    """What a trainer does with each learner batch: passes, minibatches, clipping (PPO's knobs)."""

    section: ClassVar[str] = "learner"

    epochs: int = setting(
        1, IntCheck(low=1), "Passes over each learner batch per trainer step (PPO's epochs; 1 = one pass)."
    )
    minibatches: int = setting(
        1,
        IntCheck(low=1),
        "Minibatches each pass splits the batch into (shuffled items, equal sizes): one optimizer step "
        "each, its gradients averaged in the agent group.",
    )
    batch_size: int | None = setting(
        None,
        OptionalCheck(IntCheck(low=1)),
        "Items in every learner batch (fresh and replayed, after Trainer.prepare); each step's batch is "
        "checked against it. Required when minibatches > 1, which must divide it.",
    )
    max_grad_norm: float | None = setting(
        None,
        OptionalCheck(FloatCheck(0.0, low_open=True)),
        "Clip the gradients to this global L2 norm after the agent group's average, before each optimizer "
        "step (the norm before clipping is the metric grad_norm); null = no clipping.",
    )
    target_kl: float | None = setting(
        None,
        OptionalCheck(FloatCheck(0.0, low_open=True)),
        "Stop a trainer step's epochs early (PPO, as Spinning Up and Stable-Baselines3) at the first "
        "minibatch whose KL, averaged over the agent group, exceeds 1.5 x target_kl: that minibatch's "
        "optimizer step and the rest are skipped on every member alike. The KL is the loss's auxiliary "
        "value named by kl_key; null = always take epochs x minibatches steps.",
    )
    kl_key: str = setting(
        "approx_kl",
        StrCheck(nonempty=True),
        "The auxiliary value of Trainer.loss() that target_kl reads (the KL of the minibatch between "
        "the policy that collected it and the current one).",
    )

    def check_together(self) -> None:
        if self.minibatches > 1 and self.batch_size is None:
            raise self.fail(
                "minibatches",
                f"is {self.minibatches} but learner.batch_size is null: set learner.batch_size to the items "
                "in each learner batch (the minibatches must divide it)",
            )
        if self.batch_size is not None and self.batch_size % self.minibatches:
            raise self.fail(
                "minibatches",
                f"is {self.minibatches}, which does not divide learner.batch_size {self.batch_size} "
                f"(minibatches of {self.batch_size / self.minibatches:g} items); choose a divisor of "
                f"{self.batch_size}",
            )

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per trainer step: ``epochs x minibatches``."""
        return self.epochs * self.minibatches


#: Why ``faults.on_actor_loss: continue`` (or ``replace``: ``{policy}``) is refused on the torch or local engine
#: (``{engine}``: how it was chosen).
ACTOR_LOSS_REFUSED = "is {policy}, but {engine}: {why}; use launch.engine: mpi, or on_actor_loss: fail"


@dataclass(frozen=True)
class FaultsConfig(Section):
    """Failure detection, checkpoints and message limits."""

    section: ClassVar[str] = "faults"

    heartbeat_s: float = setting(1.0, FloatCheck(0.0, low_open=True), "Seconds between heartbeats.")
    peer_timeout_s: float = setting(
        10.0, FloatCheck(0.0, low_open=True), "A rank silent this long is declared lost; must exceed heartbeat_s."
    )
    startup_timeout_s: float = setting(
        300.0,
        FloatCheck(0.0, low_open=True),
        "Deadline for every rank to finish its role's setup() (models, data) before the run starts.",
    )
    checkpoint_every: int = setting(0, IntCheck(low=0), "Checkpoint every this many steps; 0 = only at the end.")
    max_message_bytes: int = setting(
        256 * MIB, IntCheck(low=1), "Largest message a rank accepts (bytes); bigger ones are refused before allocation."
    )
    max_restarts: int = setting(
        0,
        IntCheck(low=0),
        "Times `gflowdist run` restarts a failed job from its newest intact "
        "checkpoint when a restart can cure the failure (a lost rank, a cut "
        "link, a new exception); 0 = never.",
    )
    restart_delay_s: float = setting(1.0, FloatCheck(0.0), "Seconds `gflowdist run` waits before a restart.")
    preempt_grace_s: float = setting(
        25.0,
        FloatCheck(0.0, low_open=True),
        "After SIGINT/SIGTERM (a preemption: Slurm kills 30 s after its SIGTERM), the seconds `gflowdist run` "
        "gives the job to stop and write its final checkpoint before it kills it (the previous intact "
        "checkpoint then stays the one --resume uses); must exceed peer_timeout_s.",
    )
    on_nonfinite_loss: str = setting(
        "fail",
        ChoiceCheck("fail", "skip"),
        "A trainer's NaN or infinite loss: fail the run naming rank and step, "
        "or skip the step (no gradient from this trainer) and go on.",
    )
    on_bad_batch: str = setting(
        "fail",
        ChoiceCheck("fail", "drop"),
        "A batch its buffer refuses (fields, shapes or dtypes that differ from "
        "what the buffer stores): the sender's run fails with the buffer's "
        "reason, or the batch is dropped (counted) and the sender goes on.",
    )
    on_nonfinite_batch: str = setting(
        "allow",
        ChoiceCheck("allow", "fail"),
        "NaN or infinite values in a float field of a batch a rollout returns: "
        "ship them, or fail the run naming the role class, method, field and rows.",
    )
    on_actor_loss: str = setting(
        "fail",
        ChoiceCheck("fail", "continue", "replace"),
        "A lost actor: fail the run, continue without it (its undelivered "
        "trajectories count as dropped, reason lost_rank), or replace it with a new actor "
        "started by MPI_Comm_spawn (MPI engine; at most max_restarts per job; one that fails "
        "to start is named and the run continues without it).",
    )

    def check_together(self) -> None:
        if self.on_actor_loss == "replace" and self.max_restarts == 0:
            raise self.fail(
                "on_actor_loss",
                "is replace, but faults.max_restarts is 0: under replace, max_restarts also bounds the actors "
                "one job replaces (each replacement counts as a restart), so none could be replaced; set "
                "faults.max_restarts to 1 or more, or on_actor_loss: continue",
            )
        if self.peer_timeout_s <= self.heartbeat_s:
            raise self.fail(
                "peer_timeout_s",
                f"must be greater than faults.heartbeat_s ({self.heartbeat_s}), found {self.peer_timeout_s}",
            )
        if self.preempt_grace_s <= self.peer_timeout_s:
            raise self.fail(
                "preempt_grace_s",
                f"must be greater than faults.peer_timeout_s ({self.peer_timeout_s:g}), found "
                f"{self.preempt_grace_s:g}: a rank lost while the job stops is named only after "
                "faults.peer_timeout_s, so a shorter grace can neither name it nor finish the checkpoint "
                "(lower faults.peer_timeout_s or raise faults.preempt_grace_s)",
            )


@dataclass(frozen=True)
class ReportConfig(Section):
    """What the run's report shows."""

    section: ClassVar[str] = "report"
    curves: tuple[str, ...] = setting(
        (),
        StrListCheck(),
        "Metrics report.png draws, in this order (up to 4; a metric several roles report gets a line per role); "
        "empty = the coordinator's first, then the trainers', actors', buffers', counts last.",
    )
    figure: bool | None = setting(
        None,
        OptionalCheck(BoolCheck()),
        "Draw report.png at each run's end (matplotlib: about a second of the coordinator's time). "
        "false: report.txt and report.json only (gflowdist report RUN_DIR --png PATH draws it later); "
        "null = the environment variable GFLOWDIST_REPORT_FIGURE (0 or 1) where it is set, else true.",
    )


#: The most groups an actor's environments may be split into (``inference.split``).
MAX_SPLIT = 16


@dataclass(frozen=True)
class InferenceConfig(Section):
    """The inference ranks' dynamic batching (``layout.inference``; docs/inference.md)."""

    section: ClassVar[str] = "inference"

    max_batch: int = setting(
        256,
        IntCheck(low=1),
        "An inference rank runs a batch once it holds this many observations (an actor's request is never split).",
    )
    max_delay_ms: float = setting(
        2.0,
        FloatCheck(0.0, 10000.0),
        "...or once its oldest request has waited this long (milliseconds), or once every actor it serves is waiting.",
    )
    split: int = setting(
        1,
        IntCheck(low=1, high=MAX_SPLIT),
        "An actor served by an inference rank steps its environments in this many equal groups and keeps each "
        "group's request in flight while it steps the others (double buffering at 2: pays when stepping is slow); must "
        "divide params.envs_per_actor. 1: one request for all of them, answered before any steps.",
    )


SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "launch": LaunchConfig,
    "layout": LayoutConfig,
    "roles": RolesConfig,
    "replay": ReplayConfig,
    "sync": SyncConfig,
    "learner": LearnerConfig,
    "faults": FaultsConfig,
    "report": ReportConfig,
    "inference": InferenceConfig,
}
"""Section name -> dataclass, in file order. ``params`` is the one free-form section."""
