"""A misbehaving peer for wire-fault tests: the toy trainer, plus bad messages to its buffer.

``roles.trainer: fault_roles.py:WireAbuseTrainer`` with ``params``:

- ``abuse``: ``"oversized"``: a well-formed TRAJECTORIES message of
  ``abuse_trajectories`` toy trajectories, encoded without any size limit
  (the receiver's ``faults.max_message_bytes`` must refuse it);
  ``"claim"``: only the 8-byte length header of a chunked MPI message that
  claims ``abuse_bytes`` bytes, and no part after it (MPI engine only);
- ``abuse_after``: send it after this many rollouts (default 5), once;
- ``garbage_every``: also send raw bytes that are no gflowdist message with
  every ``garbage_every``-th batch (0, the default: never);
- ``abuse_rank``: only this trainer rank misbehaves (default 1).

The bad messages go straight to the communicator on the data tag, past the
sender's channel, so the sender's own ledger never counts them.
"""

from __future__ import annotations

import inspect

import numpy as np

from gflowdist.config.classes import load_class
from gflowdist.runtime import protocol
from gflowdist.runtime.protocol import Tags
from gflowdist.transport.codec import encode

# the toy roles beside this file, loaded as a config's "toy_roles.py:ToyTrainer" would be
ToyTrainer = load_class("toy_roles.py:ToyTrainer", key="roles.trainer", file=__file__)
make_batch = inspect.getmodule(ToyTrainer).make_batch


class WireAbuseTrainer(ToyTrainer):
    def setup(self):
        super().setup()
        self.rollouts = 0

    def rollout(self, policy_version):
        batch = super().rollout(policy_version)
        self.rollouts += 1
        if self.rank != int(self.params.get("abuse_rank", 1)):
            return batch
        if "abuse" in self.params and self.rollouts == int(self.params.get("abuse_after", 5)):
            self._abuse()
        every = int(self.params.get("garbage_every", 0))
        if every and self.rollouts % every == 0:  # before this batch, on the same tag
            world, buffer = self.context.world, self.context.placement.buffer
            world.isend(b"\x00not a gflowdist message" * 3, buffer, Tags.DATA).wait(30)
        return batch

    def _abuse(self) -> None:
        world = self.context.world
        buffer = self.context.placement.buffer
        kind = self.params["abuse"]
        if kind == "oversized":
            n = int(self.params["abuse_trajectories"])
            message = protocol.trajectories(make_batch(n, self.generator), seq=0, version=0, n=n)
            payload = encode(*message, sender=self.rank, seq=0)
            world.isend(payload, buffer, Tags.DATA).wait(30)
        elif kind == "claim":
            from mpi4py import MPI

            from gflowdist.comm.mpi import wire_tag

            header = np.array([int(self.params["abuse_bytes"])], dtype=np.int64)
            world._p2p.Send([header, MPI.BYTE], buffer, wire_tag(Tags.DATA, chunked=True))
        else:
            raise ValueError(f"params.abuse must be 'oversized' or 'claim', not {kind!r}")
