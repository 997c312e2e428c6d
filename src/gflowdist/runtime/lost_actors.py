"""Going on without a lost actor (``faults.on_actor_loss: continue``): the collector's side.

Actors hold nothing a learner needs, so losing one costs only its
trajectories in flight. When an actor falls silent for longer than
``faults.peer_timeout_s`` and the config says ``continue``, the collector:

- records it (:attr:`LostActors.lost`) and tells every rank still running
  (:func:`~gflowdist.runtime.protocol.lost`): its trainer stops sending it
  weights, its buffer stops waiting for its ``done`` and its checkpoint
  markers, and no rank waits on sends to it any more;
- names it on the progress line (``lost rank 4 (actor)``), in the report's
  notes, in ``ledger.json`` (``lost_ranks``) and in the final line;
- writes its ledger from what is known: ``produced`` = the count in its last
  heartbeat (at least what the buffers received from it), ``sent`` the
  same, and what no buffer received as ``dropped["lost_rank"]``, counted
  before delivery, so the run's ledger still balances;
- fills its slot in every later checkpoint with that ledger and no role
  state: a resumed run starts that actor afresh with its counts carried on.

A lost trainer, buffer or coordinator still ends the job (promise 3): a
trainer may be inside an all-reduce of its agent group, which neither MPI
nor gloo lets the others leave, and a buffer holds its clients' replay
data; a restart (``faults.max_restarts``) is what cures those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gflowdist.layout import Role
from gflowdist.runtime import protocol
from gflowdist.runtime.ledger import Ledger
from gflowdist.runtime.wiring import Wiring

__all__ = ["LostActors"]

log = logging.getLogger("gflowdist.runtime")


class LostActors:
    """The actors this run goes on without, and what their last heartbeats said."""

    def __init__(self, w: Wiring, say: Callable[[str], None]):
        self.w = w
        self.say = say  # a line on the console, beside the progress line (ProgressLine.say)
        self.layout = w.context.layout
        self.allowed = w.settings.on_actor_loss in ("continue", "replace")  # replace: continue, then replace
        self.beats: dict[int, dict[str, Any]] = {}  # rank -> its last heartbeat's body

    @property
    def lost(self) -> dict[int, str]:
        return self.w.lost

    def heard(self, rank: int, body: Any) -> None:
        if isinstance(body, Mapping):
            self.beats[rank] = dict(body)

    def may_go_on_without(self, rank: int) -> bool:
        return self.allowed and self.layout.role_of(rank) is Role.ACTOR

    def go_on_without(self, rank: int, reason: str, why_not_replaced: str = "") -> None:
        """Record the loss, tell every rank still running, say so on the console (with why no spare takes its
        place, under ``replace``: :meth:`Replacer.no_spare_left <gflowdist.runtime.replacing.Replacer.no_spare_left>`)."""
        where = self.w.context.describe_rank(rank)
        text = f"lost {where}: {reason}"
        self.w.liveness.go_on_without(rank, text)
        for other in self.w.liveness.running_peers():  # ``rank`` is gone on without already
            self.w.control.isend(*protocol.lost(rank, text), other)
        policy = self.w.settings.on_actor_loss
        why = f"; {why_not_replaced}" if why_not_replaced else ""
        self.say(f"gflowdist: {text}; going on without it (faults.on_actor_loss = {policy}{why})")

    def received_from(self, rank: int, finals: Mapping[int, dict[str, Any]] | None = None) -> int:
        """What the buffers received from ``rank``: from their final reports, else their last heartbeats."""
        total = 0
        for buffer in self.layout.buffers:
            source = (finals or {}).get(buffer, {}).get("ledger") or self.beats.get(buffer, {})
            total += int((source.get("received_from") or {}).get(str(rank), 0))
        return total

    def ledger_of(self, rank: int, finals: Mapping[int, dict[str, Any]] | None = None) -> Ledger:
        """The lost actor's ledger: what it said it produced, what arrived, the rest dropped as ``lost_rank``."""
        received = self.received_from(rank, finals)
        produced = max(int(self.beats.get(rank, {}).get("produced", 0)), received)
        ledger = Ledger(produced=produced, sent=produced)
        ledger.drop("lost_rank", produced - received)
        return ledger

    def payload(self, rank: int, ledger: Ledger | None = None) -> dict[str, Any]:
        """Its slot in a checkpoint taken after the loss: no role state, its ledger (``ledger``, else
        :meth:`ledger_of`), its counts."""
        ledger = self.ledger_of(rank) if ledger is None else ledger
        return {
            "role": None,
            "runtime": {"produced": ledger.produced},
            "ledger": ledger.to_dict(),
            "lost": self.lost[rank],
        }

    def final_of(self, rank: int, finals: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
        """Its final report, written by the collector (it sent none)."""
        return {
            "role": Role.ACTOR.value,
            "host": self.layout.host_of(rank),
            "lost": self.lost[rank],
            "ledger": self.ledger_of(rank, finals).to_dict(),
            "timing": None,
            "step": 0,
            "summary": {},
        }

    def progress_field(self) -> dict[str, str]:
        if not self.lost:
            return {}
        return {"lost": ",".join(f"rank {r} ({self.layout.role_of(r).value})" for r in sorted(self.lost))}
