"""An actor's side of central inference (``layout.inference``): its policy runs on its inference rank.

The actor loop gives an actor whose layout names an inference rank a
:class:`RemotePolicy` as ``actor.remote``; the environment actors
(:class:`~gflowdist.rl.env_core.VectorEnvActor`) then call it instead of their
own ``act``: the observations (and per-row arguments such as each row's
epsilon) go to the inference rank (:func:`~gflowdist.runtime.protocol.infer_request`),
which batches them with the other actors' requests and answers with the
outputs ``act`` would have given, stamped with the policy version that made
them (:func:`~gflowdist.runtime.protocol.infer_reply`). No weights reach the
actor.

Every wait for a reply has a deadline, ``faults.peer_timeout_s``: an inference
rank that does not answer in time is lost, named by rank, role and host
(:class:`~gflowdist.errors.PeerLostError`). While it waits the actor keeps
heartbeating and hearing the collector. Several requests may be in flight at
once (:meth:`RemotePolicy.submit`, :meth:`RemotePolicy.result`: an actor whose
environments are split in groups, ``inference.split``); their results are taken
in the order they were sent. A refused request (its observation
shape changed) raises :class:`~gflowdist.errors.GflowdistError` with the
inference rank's text, which names the actor.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from gflowdist.comm.polling import round_trip_backoff
from gflowdist.errors import GflowdistError, PeerLostError
from gflowdist.runtime import protocol
from gflowdist.runtime.wiring import Wiring

__all__ = ["RemotePolicy"]


class RemotePolicy:
    """Calls my inference rank for actions (module docstring); ``version``: the newest policy version seen."""

    def __init__(self, w: Wiring, rank: int):
        self.w, self.rank = w, rank
        self.version = 0  # the newest version a reply carried
        self.announced = 0  # the newest version my trainer announced (protocol.policy_version)
        self.oldest: int | None = None  # the oldest version a reply carried since mark()
        self.seq = 0
        self.outstanding: deque[int] = deque()  # requests sent and not yet answered, oldest first
        self.requests = 0
        self.waited_s = 0.0

    def __call__(self, obs: torch.Tensor, *args: torch.Tensor) -> Any:
        """What the policy's ``act(obs, *args)`` gives for these rows, computed on my inference rank."""
        return self.result(self.submit(obs, *args))

    def submit(self, obs: torch.Tensor, *args: torch.Tensor) -> int:
        """Send a request for ``act(obs, *args)`` without waiting; its number, for :meth:`result`.

        Several may be in flight (``inference.split``); their results are taken in the order they were sent.
        """
        seq = self.seq
        self.seq += 1
        self.w.inference.isend(*protocol.infer_request(obs, list(args), seq), self.rank)
        self.outstanding.append(seq)
        return seq

    def result(self, seq: int) -> Any:
        """The outputs for request ``seq`` (the oldest still unanswered), waiting up to ``faults.peer_timeout_s``."""
        w = self.w
        if not self.outstanding or self.outstanding[0] != seq:
            raise GflowdistError(
                f"actor rank {w.rank} took the result of inference request {seq}, but its oldest unanswered request "
                f"is {self.outstanding[0] if self.outstanding else 'none'}: results are taken in the order sent"
            )
        started = time.monotonic()
        deadline = started + w.settings.inference_reply_s
        backoff = round_trip_backoff()
        with w.timer.wait_on(self.rank, "inference"):
            msg = w.inference.try_recv(self.rank)
            while msg is None:
                now = time.monotonic()
                if now > deadline:
                    layout = w.context.layout
                    raise PeerLostError(
                        self.rank,
                        role=layout.role_of(self.rank).value,
                        host=layout.host_of(self.rank),
                        reason=f"no answer to inference request {seq} of actor rank {w.rank} within "
                        f"{w.settings.inference_reply_s:g} s (faults.peer_timeout_s)",
                    )
                w.liveness.keep_alive()
                backoff.pause()
                msg = w.inference.try_recv(self.rank)
        self.waited_s += time.monotonic() - started
        self.outstanding.popleft()
        self.requests += 1
        body = msg.body
        if not isinstance(body, Mapping) or body.get("seq") != seq:
            got = body.get("seq") if isinstance(body, Mapping) else type(body).__name__
            raise GflowdistError(
                f"inference rank {self.rank} answered request {got} while actor rank {w.rank} waited for {seq}"
            )
        if "refused" in body:
            raise GflowdistError(f"inference rank {self.rank} refused a request: {body['refused']}")
        version = int(body["version"])
        self.version = max(self.version, version)
        self.oldest = version if self.oldest is None else min(self.oldest, version)
        return body["out"]

    @property
    def pace_version(self) -> int:
        """How far learning is, as far as I know: what a rollout paces itself by."""
        return max(self.version, self.announced)

    def mark(self) -> None:
        """A rollout begins: :meth:`stamp` covers the replies from here on."""
        self.oldest = None

    def stamp(self) -> int:
        """The policy version of the rollout since :meth:`mark`: its oldest reply's (the newest reply's before it
        when it asked nothing)."""
        return self.version if self.oldest is None else self.oldest

    def finish(self) -> None:
        """My last request was answered: my inference rank may stop serving me."""
        if self.outstanding:
            raise GflowdistError(
                f"actor rank {self.w.rank} finished with inference requests {list(self.outstanding)} unanswered"
            )
        self.w.inference.send(*protocol.done(), self.rank)
