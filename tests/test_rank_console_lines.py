"""A rank's printed lines reach the launcher whole: one write per line, so hydra never glues two ranks' lines.

``gflowdist run`` starts ranks with ``PYTHONUNBUFFERED=1``: Python then writes
``print("x")`` as two writes, ``x`` and the newline, and another rank's line
can be forwarded between them ("...step 5rank 1 ready"). The stream here
records each write the way a pipe sees them.
"""

from __future__ import annotations

import contextlib
import io
import sys

from gflowdist.runtime.process import print_whole_lines


class Writes(io.RawIOBase):
    """A raw stream that keeps each write it is given."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.calls.append(bytes(b))
        return len(b)


@contextlib.contextmanager
def unbuffered_stdout():
    """stdout as ``python -u`` makes it: a text layer writing straight through to the raw stream (set inside
    the test: pytest puts its own capture back on sys.stdout between a fixture and the test)."""
    raw, kept = Writes(), sys.stdout
    sys.stdout = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    try:
        yield raw
    finally:
        sys.stdout = kept


def test_unbuffered_print_is_two_writes_which_is_why_lines_glue():
    with unbuffered_stdout() as raw:
        print("rank 0 step 5")
    assert raw.calls == [b"rank 0 step 5", b"\n"]


def test_after_print_whole_lines_each_line_is_one_write_and_a_partial_line_waits():
    with unbuffered_stdout() as raw:
        print_whole_lines()
        print("rank 0 step 5")
        print("a", "b", end="")
        print(" c")
        sys.stdout.write("progress 10%")
        calls = list(raw.calls)
        sys.stdout.flush()  # an explicit flush (the progress line's) still goes out at once
    assert calls == [b"rank 0 step 5\n", b"a b c\n"]
    assert raw.calls[2:] == [b"progress 10%"]


def test_a_stream_the_user_replaced_is_left_alone():
    mine, kept = io.StringIO(), sys.stdout
    sys.stdout = mine
    try:
        print_whole_lines()
        print("kept")
    finally:
        sys.stdout = kept
    assert mine.getvalue() == "kept\n"
