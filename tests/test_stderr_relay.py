"""The launcher's stderr relay: lines pass through at once, and the failure to believe is chosen."""

from __future__ import annotations

import io
import os

from gflowdist.cli.stderr_relay import StderrRelay, choose_failure
from gflowdist.jobenv import FAILURE_MARK


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


def test_a_marked_failure_line_is_remembered_not_printed_and_mpi_abort_lines_after_it_are_dropped():
    """A failing rank writes its first line marked; the launcher prints the whole message once, from the file."""
    abort = "Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1) - process 1\n"
    text = (
        abort  # before any failure: not ours to hide
        + FAILURE_MARK
        + "gflowdist: rank 1 (trainer on vm) failed at step 30: RuntimeError: boom\n"
        + "a rank's own line\n"
        + abort
    )
    relay, sink = relay_of(text)
    assert sink.getvalue() == abort + "a rank's own line\n"
    assert relay.seen("gflowdist: rank 1 (trainer on vm) failed at step 30: RuntimeError: boom")
