"""The ledger: every trajectory accounted for.

Each rank counts, per trajectory (not per message):

- producers (trainers, actors): ``produced``, ``sent``, ``used_locally``
  (consumed without a buffer), ``in_flight`` (sent but not yet known to be
  delivered; zero after the shutdown drain);
- buffers: ``received`` (per producer), ``admitted`` and ``dropped`` by
  reason (``duplicate``, ``low_score``, ``stale``, ``rate_limit``, ``bad_batch``,
  ``queue_full``); ``evicted`` (admitted items later overwritten for capacity:
  delivered, then dropped; reported, not part of the balance); ``expired``
  (admitted items a queue later dropped as too stale to serve: counted in
  ``dropped["stale"]`` too, and taken out of the balance, which counts each
  item's fate on receipt once);
- trainers of a queue: ``dropped["unlearned"]`` and ``expired`` for the items of
  a prefetched reply read and dropped at a checkpoint cut or the end (served
  once by the queue, never learned from);
  ``malformed`` messages per sender (rejected before anything in them could be
  counted as a trajectory; reported, not part of the balance); and
  ``refused`` batches per sender (well-formed messages whose batch the
  storage could not take; their trajectories are in ``dropped["bad_batch"]``).
- a lost actor (``faults.on_actor_loss: continue``): the collector writes
  its ledger from its last heartbeat, ``produced`` = what it said it had
  produced (at least what the buffers received from it), and what no buffer
  received as ``dropped["lost_rank"]``: dropped before delivery.

At shutdown the collector checks, for the whole job::

    produced == used_locally + received_by_buffers + in_flight + dropped_before_delivery
    received_by_buffers == admitted + sum(dropped after receipt) - expired

where ``dropped_before_delivery`` is a producer's ``dropped["lost_rank"]``.

A mismatch raises :class:`~gflowdist.errors.LedgerError` naming the producer
whose counts disagree: it is an error, not a warning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gflowdist.errors import LedgerError

__all__ = ["Ledger", "check_ledgers", "BEFORE_DELIVERY"]

#: Drop reasons counted by a producer, before a buffer received anything (the others are a buffer's).
BEFORE_DELIVERY = ("lost_rank",)


@dataclass
class Ledger:
    """One rank's counts of trajectories (the module docstring says which role counts which).

    Producers fill ``produced``, ``sent``, ``used_locally`` and ``in_flight``;
    buffers fill ``received`` (and ``received_from`` per producer),
    ``admitted``, ``evicted``, ``dropped`` by reason, ``malformed`` messages
    and ``refused`` batches per sender. Each rank sends its ledger in its final
    report; :func:`check_ledgers` balances them over the job.
    """

    produced: int = 0
    sent: int = 0
    used_locally: int = 0
    in_flight: int = 0
    received: int = 0
    admitted: int = 0
    evicted: int = 0
    expired: int = 0  # of dropped["stale"]: admitted first, dropped by a queue before being served
    dropped: Counter[str] = field(default_factory=Counter)
    received_from: Counter[int] = field(default_factory=Counter)
    malformed: Counter[int] = field(default_factory=Counter)  # sender rank -> malformed messages
    refused: Counter[int] = field(default_factory=Counter)  # sender rank -> batches the storage could not take

    def drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] += int(n)

    def to_dict(self) -> dict[str, Any]:
        return {
            "produced": self.produced,
            "sent": self.sent,
            "used_locally": self.used_locally,
            "in_flight": self.in_flight,
            "received": self.received,
            "admitted": self.admitted,
            "evicted": self.evicted,
            "expired": self.expired,
            "dropped": dict(self.dropped),
            "received_from": {str(k): v for k, v in self.received_from.items()},
            "malformed": {str(k): v for k, v in self.malformed.items()},
            "refused": {str(k): v for k, v in self.refused.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Ledger:
        return cls(
            produced=data.get("produced", 0),
            sent=data.get("sent", 0),
            used_locally=data.get("used_locally", 0),
            in_flight=data.get("in_flight", 0),
            received=data.get("received", 0),
            admitted=data.get("admitted", 0),
            evicted=data.get("evicted", 0),
            expired=data.get("expired", 0),
            dropped=Counter(data.get("dropped", {})),
            received_from=Counter({int(k): v for k, v in data.get("received_from", {}).items()}),
            malformed=Counter({int(k): v for k, v in data.get("malformed", {}).items()}),
            refused=Counter({int(k): v for k, v in data.get("refused", {}).items()}),
        )


def check_ledgers(ledgers: Mapping[int, Ledger]) -> dict[str, int]:
    """Check the balance over all ranks; returns the totals, raises :class:`LedgerError`."""
    received_from: Counter[int] = Counter()
    for ledger in ledgers.values():
        received_from.update(ledger.received_from)
    problems = []
    for rank, ledger in sorted(ledgers.items()):
        delivered = received_from.get(rank, 0)
        lost = sum(ledger.dropped.get(reason, 0) for reason in BEFORE_DELIVERY)
        if ledger.produced != ledger.used_locally + delivered + ledger.in_flight + lost:
            problems.append(
                f"rank {rank} produced {ledger.produced} but {ledger.used_locally} were used "
                f"locally, {delivered} reached a buffer, {ledger.in_flight} are in flight"
                + (f" and {lost} were lost with it" if lost else "")
            )
        dropped = sum(ledger.dropped.values()) - lost - ledger.expired
        if ledger.received != ledger.admitted + dropped:
            problems.append(
                f"buffer rank {rank} received {ledger.received} but admitted {ledger.admitted} and dropped {dropped}"
            )
    totals = {
        "produced": sum(item.produced for item in ledgers.values()),
        "used_locally": sum(item.used_locally for item in ledgers.values()),
        "received": sum(item.received for item in ledgers.values()),
        "admitted": sum(item.admitted for item in ledgers.values()),
        "dropped": sum(sum(item.dropped.values()) for item in ledgers.values()),
        "in_flight": sum(item.in_flight for item in ledgers.values()),
        "evicted": sum(item.evicted for item in ledgers.values()),
        "expired": sum(item.expired for item in ledgers.values()),
        "malformed_messages": sum(sum(item.malformed.values()) for item in ledgers.values()),
        "refused_batches": sum(sum(item.refused.values()) for item in ledgers.values()),
    }
    if problems:
        raise LedgerError("the ledger does not balance: " + "; ".join(problems))
    return totals
