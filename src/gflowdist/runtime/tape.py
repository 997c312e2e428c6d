"""Record and replay: the choices a rank's loops make that depend on timing, written down in the order made.

With the same seed two runs of an asynchronous job differ: which client's
trajectories a buffer takes first, whether a poll finds the new weights yet,
at which step a stop is seen. Each such choice goes through this rank's tape
(``Wiring.choices``, :mod:`gflowdist.runtime.choices`), at one of a few *sites*:

| site | where | the choice |
|---|---|---|
| ``DATA`` | a buffer's loop | which client's message it takes next (sender, type, sequence number) |
| ``CONTROL`` | the collector | which rank's control message it takes next (heartbeats are not choices) |
| ``INBOX`` | an actor's loop | which of its trainer's messages (weights, markers, stop) it takes before a rollout |
| ``STOP`` | trainers, actors | the step before which a stop was seen, and its reason |
| ``SUMMARY`` | a buffer's idle turns | that a summary for the coordinator went out now (a timed choice) |
| ``WEIGHTS`` | a trainer's turns | which actor got no weights this time (its earlier weights still in flight) |
| ``INFER`` | an inference rank's loop | which actor's request (or done) it takes next |
| ``SERVE`` | an inference rank's loop | that the requests gathered so far run as one batch now (which requests were batched together) |
| ``LOSS``, ``BATCH`` | trainers; trainers and actors | checks, not choices: each step's loss, a digest of each shipped batch |

Every event is ``[site, point, ..., ms]``, ``ms`` the milliseconds since the
tape opened (a replay waits for a recorded message about ten times as long as the
recorded run took to come to it, at least ``faults.peer_timeout_s``), and
``point`` where the rank was:
a trainer's step (a turn of its loop), an actor's iteration, a buffer's count of messages taken
(an inference rank's: of the requests and dones it took; its trainer's weights and stop are
``INBOX`` events at that count),
:data:`FREE` in loops that run for as long as messages come (the
coordinator's, the collector's wait for the final reports).

:class:`Tape` (the default) does the plain operation and writes nothing.
:class:`RecordingTape` (``gflowdist run --record``) does the same and writes
each event to ``record/rank-N.msgpack`` in the run directory.
:class:`~gflowdist.runtime.replaying.ReplayTape` (``gflowdist replay``) makes
each call return what the recording says, in the recorded order. The file:
msgpack objects one after another, a header map, the events (arrays), a
footer map ``{"end": true, "events": n}``; no pickle, nothing but plain values.
"""

from __future__ import annotations

import enum
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import msgpack
import torch

from gflowdist.errors import GflowdistError, ProtocolError
from gflowdist.transport import Message
from gflowdist.transport.channel import Channel

__all__ = [
    "Site",
    "Tape",
    "RecordingTape",
    "FREE",
    "MALFORMED",
    "RECORD_FORMAT",
    "recording_path",
    "read_recording",
    "batch_digest",
]

#: Version of the recording files (2: each event ends with its milliseconds since the tape opened; 3: WEIGHTS events;
#: 4: INFER and SERVE events, of inference ranks).
RECORD_FORMAT = 4
#: The point of an event in a loop that is not counted in steps (as long as messages come).
FREE = -1
#: The "type" of a take that raised ProtocolError (a malformed message, counted and skipped).
MALFORMED = -1


class Site(enum.IntEnum):
    """Where a choice is made (the module docstring's table); the values are in the files."""

    DATA = 1
    CONTROL = 2
    INBOX = 3
    STOP = 4
    SUMMARY = 5
    LOSS = 6
    BATCH = 7
    WEIGHTS = 8
    INFER = 9
    SERVE = 10

    @property
    def numbered(self) -> bool:
        """Whether the sender's sequence number of a taken message is recorded (and checked on replay).

        Not on CONTROL: heartbeats share its numbers, and how many a rank sends depends on time.
        """
        return self in (Site.DATA, Site.INBOX, Site.INFER)


def recording_path(run_dir: str | Path, rank: int) -> Path:
    """``<run dir>/record/rank-N.msgpack``."""
    return Path(run_dir) / "record" / f"rank-{rank}.msgpack"


def batch_digest(batch: Mapping[str, Any]) -> int:
    """CRC-32 of a batch's field names, dtypes, shapes and bytes (the ``BATCH`` check); ~1 ms per MB."""
    crc = 0
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, torch.Tensor):
            t = value.detach().to("cpu").contiguous()
            crc = zlib.crc32(f"{name}:{t.dtype}:{tuple(t.shape)}".encode(), crc)
            if t.numel():
                crc = zlib.crc32(t.reshape(-1).view(torch.uint8).numpy(), crc)
        else:
            crc = zlib.crc32(f"{name}={value!r}".encode(), crc)
    return crc


class Tape:
    """Neither recording nor replaying: every call is the plain operation (see the module docstring)."""

    recording = False
    replaying = False

    def take(
        self,
        site: Site,
        channel: Channel,
        point: int = FREE,
        *,
        source: int | None = None,
        wait: bool = False,
        transparent: Callable[[Message], bool] | None = None,
        keep_alive: Callable[[], None] | None = None,
    ) -> Message | None:
        """The next message of ``channel`` (from ``source``, or anyone) at ``site``, or None.

        ``transparent`` says which messages are not choices (heartbeats): they
        are returned and not recorded. ``wait``: under replay, wait for the
        recorded message rather than say None (a loop that takes at fixed
        points, e.g. once per step), calling ``keep_alive`` (heartbeats) meanwhile.
        """
        return channel.try_recv(source)

    def stop(self, point: int, seen: bool, reason: str) -> tuple[bool, str]:
        """Whether to stop before ``point`` (``seen``: a stop was seen now), and why."""
        return seen, reason

    def decide(self, site: Site, point: int, value: bool, who: int | None = None) -> bool:
        """A choice made by the clock (``value``): True/False as made now, or as recorded.

        ``who``: the rank the choice is about, when one point makes several (one per actor).
        """
        return value

    def check(self, site: Site, point: int, value: Any) -> None:
        """A value that a replay must reproduce exactly (a loss, a digest)."""

    def reached(self, point: int) -> None:
        """The rank's loop is at ``point`` now (a replay names it beside a divergence counted in trajectories)."""

    def finish(self) -> None:
        """The rank's loop ended (a replay checks that it replayed every recorded event)."""

    def close(self) -> None:
        """Close the file, if any."""


class RecordingTape(Tape):
    """Makes each choice as :class:`Tape` does and writes it to ``path`` (module docstring)."""

    recording = True

    def __init__(self, path: str | Path, header: Mapping[str, Any]):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file: IO[bytes] | None = open(path, "wb", buffering=1 << 16)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._file.write(self._packer.pack({"format": RECORD_FORMAT, **header}))
        self.events = 0
        self._opened = time.monotonic()

    def _write(self, *event: Any) -> None:
        if self._file is None:
            raise GflowdistError(f"{self.path}: a choice made after the recording was closed")
        self._file.write(self._packer.pack((*event, int(1e3 * (time.monotonic() - self._opened)))))
        self.events += 1

    def take(
        self,
        site: Site,
        channel: Channel,
        point: int = FREE,
        *,
        source: int | None = None,
        wait: bool = False,
        transparent: Callable[[Message], bool] | None = None,
        keep_alive: Callable[[], None] | None = None,
    ) -> Message | None:
        try:
            msg = channel.try_recv(source)
        except ProtocolError as err:
            self._write(site, point, -1 if err.sender is None else err.sender, MALFORMED, -1)
            raise
        if msg is None or (transparent is not None and transparent(msg)):
            return msg
        self._write(site, point, msg.sender, int(msg.type), msg.seq if site.numbered else -1)
        return msg

    def stop(self, point: int, seen: bool, reason: str) -> tuple[bool, str]:
        if seen:
            self._write(Site.STOP, point, reason)
        return seen, reason

    def decide(self, site: Site, point: int, value: bool, who: int | None = None) -> bool:
        if value:
            self._write(site, point) if who is None else self._write(site, point, who)
        return value

    def check(self, site: Site, point: int, value: Any) -> None:
        self._write(site, point, value)

    def close(self) -> None:
        if self._file is not None:
            self._file.write(self._packer.pack({"end": True, "events": self.events}))
            self._file.close()
            self._file = None


def read_recording(path: str | Path) -> tuple[dict[str, Any], list[list[Any]], bool]:
    """``(header, events, complete)`` of one rank's recording; ``complete``: its footer is there.

    Raises :class:`GflowdistError` naming the file when it is missing or not a recording.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=True)
            header = next(unpacker, None)
            if not isinstance(header, dict) or header.get("format") != RECORD_FORMAT:
                raise GflowdistError(f"{path}: not a gflowdist recording (format {RECORD_FORMAT})")
            events: list[Any] = []
            complete = False
            for item in unpacker:
                if isinstance(item, dict):
                    complete = bool(item.get("end")) and item.get("events") == len(events)
                    break
                events.append(item)
    except OSError as err:
        raise GflowdistError(f"cannot read the recording {path}: {err.strerror or err}") from err
    except (ValueError, msgpack.UnpackException) as err:
        raise GflowdistError(f"{path}: damaged recording ({type(err).__name__}: {err})") from err
    return header, events, complete
