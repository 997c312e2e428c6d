"""The ledger: every trajectory accounted for.

Each rank counts, per trajectory (not per message):

- producers (trainers, actors): ``produced``, ``sent``, ``used_locally``
  (consumed without a buffer), ``in_flight`` (sent but not yet known to be
  delivered; zero after the shutdown drain);
- buffers: ``received`` (per producer), ``admitted`` and ``dropped`` by
  reason (``duplicate``, ``low_score``, ``staleness``,
  ``rate_limit``); ``evicted`` (admitted items later overwritten for capacity:
  delivered, then dropped; reported, not part of the balance); and
  ``malformed`` messages per sender (rejected before anything in them could be
  counted as a trajectory; reported, not part of the balance).

At shutdown the collector checks, for the whole job::

    produced == used_locally + received_by_buffers + in_flight
    received_by_buffers == admitted + sum(dropped)

A mismatch raises :class:`~gflowdist.errors.LedgerError` naming the producer
whose counts disagree: it is an error, not a warning.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from gflowdist.errors import LedgerError

__all__ = ["Ledger", "check_ledgers"]


@dataclass
class Ledger:
    produced: int = 0
    sent: int = 0
    used_locally: int = 0
    in_flight: int = 0
    received: int = 0
    admitted: int = 0
    evicted: int = 0
    dropped: Counter = field(default_factory=Counter)
    received_from: Counter = field(default_factory=Counter)
    malformed: Counter = field(default_factory=Counter)  # sender rank -> malformed messages

    def drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] += int(n)

    def to_dict(self) -> dict[str, Any]:
        return {"produced": self.produced, "sent": self.sent, "used_locally": self.used_locally,
                "in_flight": self.in_flight, "received": self.received, "admitted": self.admitted,
                "evicted": self.evicted, "dropped": dict(self.dropped),
                "received_from": {str(k): v for k, v in self.received_from.items()},
                "malformed": {str(k): v for k, v in self.malformed.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Ledger":
        return cls(produced=data.get("produced", 0), sent=data.get("sent", 0),
                   used_locally=data.get("used_locally", 0), in_flight=data.get("in_flight", 0),
                   received=data.get("received", 0), admitted=data.get("admitted", 0),
                   evicted=data.get("evicted", 0), dropped=Counter(data.get("dropped", {})),
                   received_from=Counter({int(k): v for k, v in data.get("received_from", {}).items()}),
                   malformed=Counter({int(k): v for k, v in data.get("malformed", {}).items()}))


def check_ledgers(ledgers: Mapping[int, Ledger]) -> dict[str, int]:
    """Check the balance over all ranks; returns the totals, raises :class:`LedgerError`."""
    received_from: Counter = Counter()
    for ledger in ledgers.values():
        received_from.update(ledger.received_from)
    problems = []
    for rank, ledger in sorted(ledgers.items()):
        delivered = received_from.get(rank, 0)
        if ledger.produced != ledger.used_locally + delivered + ledger.in_flight:
            problems.append(f"rank {rank} produced {ledger.produced} but {ledger.used_locally} were used "
                            f"locally, {delivered} reached a buffer and {ledger.in_flight} are in flight")
        if ledger.received != ledger.admitted + sum(ledger.dropped.values()):
            problems.append(f"buffer rank {rank} received {ledger.received} but admitted {ledger.admitted} "
                            f"and dropped {sum(ledger.dropped.values())}")
    totals = {
        "produced": sum(l.produced for l in ledgers.values()),
        "used_locally": sum(l.used_locally for l in ledgers.values()),
        "received": sum(l.received for l in ledgers.values()),
        "admitted": sum(l.admitted for l in ledgers.values()),
        "dropped": sum(sum(l.dropped.values()) for l in ledgers.values()),
        "in_flight": sum(l.in_flight for l in ledgers.values()),
        "evicted": sum(l.evicted for l in ledgers.values()),
        "malformed_messages": sum(sum(l.malformed.values()) for l in ledgers.values()),
    }
    if problems:
        raise LedgerError("the ledger does not balance: " + "; ".join(problems))
    return totals
