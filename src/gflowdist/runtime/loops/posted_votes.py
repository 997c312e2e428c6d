"""Stop votes posted a step ahead: an agent group's trainers agree to stop without meeting at every step.

In ``sync.mode: models`` the trainers of a group meet only where they average
their weights (every ``sync.every`` versions); between meetings each learns
alone. A stop vote taken as a collective at every step would hold them in
lock-step all the same: at every step the faster one would wait for the
slower one. So each member *posts* its vote about step ``s + 1`` to every
other member as it starts step ``s`` (one small message each, not waited
for), and at the start of step ``s + 1`` takes the others' votes about it:

    top of step s:      take everyone's vote about s (posted a step ago); stop if any says so
                        else post mine about s + 1 (a stop seen from now on)

A member waits for a vote only when a peer is more than a step behind it, and
a stop is decided at most two steps after a member saw it, on every member at
the same step. Each vote names its step; one about another step than the one
expected means the members disagree on where they are, and fails naming the
sender. Votes travel on the group's own communicator under
:data:`VOTE_TAG`, which nothing else there uses.
"""

from __future__ import annotations

import numpy as np

from gflowdist.comm import Communicator
from gflowdist.comm.base import AsyncSendHandle
from gflowdist.errors import GflowdistError

__all__ = ["PostedVotes", "VOTE_TAG"]

#: the tag of a stop vote on an agent group's communicator
VOTE_TAG = 1


class PostedVotes:
    """My posted votes and my peers' on ``comm`` (an agent group of more than one member)."""

    def __init__(self, comm: Communicator):
        self.comm = comm
        self.peers = [r for r in range(comm.size) if r != comm.rank]
        #: the step my last posted vote is about, and what it said (None: nothing posted yet)
        self.posted: tuple[int, bool] | None = None
        self._sends: list[AsyncSendHandle] = []

    def post(self, step: int, stop: bool) -> None:
        """Send every peer my vote about ``step`` (not waited for)."""
        vote = np.array([step, int(stop)], dtype=np.int64)
        self._sends = [h for h in self._sends if not h.is_complete()]
        self._sends.extend(self.comm.isend(vote, peer, VOTE_TAG) for peer in self.peers)
        self.posted = (step, stop)

    def take(self, step: int) -> bool:
        """Whether any member voted to stop before ``step`` (mine must be posted): the peers' votes, waited for."""
        if self.posted is None or self.posted[0] != step:
            raise RuntimeError(f"no vote of mine about step {step} was posted")  # the caller posts first
        stop = self.posted[1]
        for peer in self.peers:
            _, payload = self.comm.recv(peer, VOTE_TAG)
            voted = np.frombuffer(payload.numpy().tobytes(), dtype=np.int64)
            if voted.size != 2 or int(voted[0]) != step:
                raise GflowdistError(
                    f"agent group: trainer rank {self.comm.world_rank(peer)} voted about stopping before step "
                    f"{voted[0] if voted.size else '?'}, this trainer about step {step}: the group's members "
                    f"are not at the same step"
                )
            stop = stop or bool(voted[1])
        self.posted = None
        return stop
