"""The launcher's stderr relay: lines pass through at once, and the failure to believe is chosen."""

from __future__ import annotations

import io
import os

from gflowdist.cli.stderr_relay import StderrRelay, choose_failure


def relay_of(text: str) -> tuple[StderrRelay, io.StringIO]:
    read_end, write_end = os.pipe()
    sink = io.StringIO()
    relay = StderrRelay(os.fdopen(read_end, "rb"), sink)
    with os.fdopen(write_end, "wb") as w:
        w.write(text.encode())
    relay.join(10)
    return relay, sink


def test_every_line_is_copied_and_failure_lines_are_remembered():
    text = (
        "some rank's warning\n"
        "gflowdist: lost rank 3 (trainer on b): no heartbeat for 3.0 s\n"
        "  gflowdist: indented, not a failure line\n"
        "last line without newline"
    )
    relay, sink = relay_of(text)
    assert sink.getvalue() == text
    assert relay.failure_lines == ["gflowdist: lost rank 3 (trainer on b): no heartbeat for 3.0 s"]
    assert relay.seen("gflowdist: lost rank 3 (trainer on b): no heartbeat for 3.0 s  ")
    assert not relay.seen("gflowdist: lost rank 0 (coordinator on a): no heartbeat for 3.0 s")


def test_the_failure_seen_through_the_launcher_wins_over_an_earlier_one():
    # both sides of a partition wrote to the failure file; only the launcher's side reached mpiexec
    cut_side = "gflowdist: lost rank 0 (coordinator on a): no heartbeat for 3.0 s\ntraceback..."
    our_side = "gflowdist: lost rank 3 (trainer on b): no heartbeat for 3.0 s"
    relay, _ = relay_of(our_side + "\n")
    assert choose_failure([cut_side, our_side], relay) == our_side
    assert choose_failure([cut_side, our_side], None) == cut_side
    relay_nothing, _ = relay_of("unrelated\n")
    assert choose_failure([cut_side, our_side], relay_nothing) == cut_side
    assert choose_failure([], relay) is None
