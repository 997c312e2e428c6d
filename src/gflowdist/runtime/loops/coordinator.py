"""The coordinator's loop: listen, print progress, decide to stop, until every other rank sent its final report.

    per turn: hear the control channel (heartbeats, metrics, summaries, saved parts, final reports)
              -> stop the trainers and actors once a signal or ``should_stop()`` says so
              -> the progress line -> back off while nothing arrives

Timed phases (the report's ``[coordinator]`` rows): ``collect``, each turn that
heard something (handling it and the progress line); ``idle``, each stretch of
turns that heard nothing (one entry per stretch, not per poll, so a long run
keeps few entries). On the trace an idle stretch ends where the turn that
ended it began, before that turn's ``collect``.
"""

from __future__ import annotations

import time

from gflowdist.comm.polling import Backoff
from gflowdist.runtime import protocol
from gflowdist.runtime.collector import Collector
from gflowdist.runtime.roles import Coordinator
from gflowdist.runtime.wiring import Wiring

__all__ = ["run_coordinator"]


def run_coordinator(coordinator: Coordinator, w: Wiring, collector: Collector) -> None:
    """Run the coordinator loop until every other rank's final report has arrived."""
    layout = w.context.layout
    stop_sent = False
    backoff = Backoff(spin_s=0.0, first_sleep_s=0.001, max_sleep_s=0.02)
    idle_s = idle_end = 0.0  # the current idle stretch: its seconds, when its last turn ended
    while not collector.all_reported():
        started = time.perf_counter()
        got = collector.poll()
        decided = False if stop_sent or w.stop else coordinator.should_stop()
        if not stop_sent and (w.stop or decided):
            # a signal's reason, if one came first, stays; should_stop() may say why (a str)
            w.stop.set(decided if isinstance(decided, str) else f"{type(coordinator).__name__}.should_stop()")
            reason = w.stop.reason
            for rank in layout.trainers + layout.actors:
                if w.liveness.may_send_to(rank):  # an actor not told here hears stop from its trainer
                    w.control.isend(*protocol.stop(reason), rank)
            stop_sent = True
        collector.progress()
        if got:
            if idle_s:
                w.timer.record("idle", idle_s, end=started)  # it ended as this turn began
                idle_s = 0.0
            now = time.perf_counter()
            w.timer.record("collect", now - started, end=now)
            backoff.reset()
        else:
            backoff.pause()
            idle_end = time.perf_counter()
            idle_s += idle_end - started
    if idle_s:
        w.timer.record("idle", idle_s, end=idle_end)
