"""Checks of trace.json events that several tests make."""

from __future__ import annotations

__all__ = ["nested_on_each_track"]


def nested_on_each_track(events: list[dict]) -> bool:
    """Whether every duration event (``"ph": "X"``) lies inside or after the ones it starts in, track by track
    (what trace viewers need)."""
    for pid in {e["pid"] for e in events if e["ph"] == "X"}:
        open_ends: list[float] = []
        for e in sorted((e for e in events if e["ph"] == "X" and e["pid"] == pid), key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            if open_ends and e["ts"] + e["dur"] > open_ends[-1]:
                return False
            open_ends.append(e["ts"] + e["dur"])
    return True
