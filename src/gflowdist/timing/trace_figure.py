"""A picture of ``trace.json`` (a stretch of it): one row per rank, its events as bars, messages as arrows.

For where no trace viewer runs (Perfetto's UI needs a browser and the web;
chrome://tracing a Chrome): :func:`draw_timeline` draws, with matplotlib's
object API,

- one row per track (rank), named as in the trace (``rank 3 buffer @node-a``);
- each duration event as a bar, colour by name (phases, collectives;
  messages thin and grey), nested events drawn thinner on top;
- each arrow (flow) from its send to its take;
- the last arriver of each collective as a black triangle above its bar;
  instants (a checkpoint, a fault, a stop) as a black diamond.

``gflowdist report RUN_DIR --timeline PNG [--window START_MS:END_MS]`` calls it.
A window that misses the trace's time span (:func:`trace_span_ms`) is an
error (:class:`WindowError`, naming the span), not an empty picture.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gflowdist.errors import GflowdistError

__all__ = ["draw_timeline", "default_window", "trace_span_ms", "check_window", "WindowError"]


class WindowError(GflowdistError):
    """The window to draw holds no moment of the trace; the message names the trace's time span."""


#: Colours of events by name, in order of first appearance (matplotlib's cycle without its grey: messages are grey).
_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9", "navy", "maroon", "darkgreen", "gold")


def default_window(trace: Mapping[str, Any], span_ms: float = 150.0) -> tuple[float, float]:
    """``span_ms`` of the trace (milliseconds) ending where its middle ends: training, not start-up or shutdown."""
    stamps = [e["ts"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    if not stamps:
        return 0.0, span_ms
    middle = (min(stamps) + max(stamps)) / 2e3
    return middle, middle + span_ms


def trace_span_ms(trace: Mapping[str, Any]) -> tuple[float, float] | None:
    """The trace's time span in milliseconds of its time line: from its first event's start to its last
    event's end (duration events, instants, arrows); None for a trace without events."""
    events = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i", "s", "f") and "ts" in e]
    if not events:
        return None
    return (min(e["ts"] for e in events) / 1e3, max(e["ts"] + e.get("dur", 0.0) for e in events) / 1e3)


def check_window(trace: Mapping[str, Any], window_ms: tuple[float, float]) -> None:
    """Raise :class:`WindowError` when ``window_ms`` (start, end in ms) misses the trace's time span."""
    span = trace_span_ms(trace)
    start, end = window_ms
    if span is not None and (end < span[0] or start > span[1]):
        raise WindowError(
            f"the window {start:g}:{end:g} ms is outside the trace, which spans {span[0]:.1f} to {span[1]:.1f} ms"
        )


def _layers(events: list[dict]) -> dict[int, int]:
    """Nesting depth of each duration event on its track (0 = outermost), by index."""
    depth: dict[int, int] = {}
    open_ends: dict[int, list[float]] = {}
    for i in sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"])):
        e = events[i]
        stack = open_ends.setdefault(e["pid"], [])
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        depth[i] = len(stack)
        stack.append(e["ts"] + e["dur"])
    return depth


def draw_timeline(
    trace: Mapping[str, Any], path: str | Path, *, window_ms: tuple[float, float] | None = None, dpi: int = 120
) -> Path:
    """Draw ``window_ms`` (start, end in ms of the trace's time line; default :func:`default_window`) to PNG ``path``.

    Raises:
        WindowError: ``window_ms`` is outside the trace's time span (:func:`check_window`).
    """
    from matplotlib.figure import Figure

    start, end = window_ms or default_window(trace)
    check_window(trace, (start, end))
    lo, hi = start * 1e3, end * 1e3
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    pids = sorted(names) or sorted({e["pid"] for e in events if "pid" in e})
    row = {pid: len(pids) - 1 - i for i, pid in enumerate(pids)}
    spans = [e for e in events if e.get("ph") == "X" and e["ts"] < hi and e["ts"] + e["dur"] > lo and e["pid"] in row]
    fig = Figure(figsize=(14.0, 1.0 + 0.9 * len(pids)))
    ax = fig.add_axes((0.17, 0.12, 0.81, 0.8))
    colours: dict[str, str] = {}
    depth = _layers(spans)
    for i, e in enumerate(spans):
        message = e.get("cat") == "message"
        colour = "0.55" if message else colours.setdefault(e["name"], _COLOURS[len(colours) % len(_COLOURS)])
        height = 0.16 if message else max(0.7 - 0.2 * depth[i], 0.2)
        y = row[e["pid"]] - height / 2
        ax.broken_barh(
            [((e["ts"] - lo) / 1e3, e["dur"] / 1e3)],
            (y, height),
            color=colour,
            linewidth=0,
            label=None if message else e["name"],
        )
        if e.get("cat") == "collective" and e["args"].get("last_arriver") == e["pid"]:
            ax.plot((e["ts"] - lo) / 1e3, y + height + 0.06, marker="v", color="black", markersize=5)
    _arrows(ax, events, row, lo, hi)
    for e in events:
        if e.get("ph") == "i" and lo <= e["ts"] <= hi and e.get("pid") in row:
            ax.plot((e["ts"] - lo) / 1e3, row[e["pid"]] + 0.42, marker="D", color="black", markersize=5)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    if unique:  # a stretch with only messages, instants or nothing has no legend (and ncol must be >= 1)
        ax.legend(
            unique.values(),
            unique.keys(),
            fontsize=7,
            loc="upper center",
            ncol=min(len(unique), 10),
            bbox_to_anchor=(0.5, 1.12),
            frameon=False,
        )
    ax.set_yticks([row[p] for p in pids])
    ax.set_yticklabels([names.get(p, f"rank {p}") for p in pids], fontsize=8)
    ax.set_xlim(0.0, (hi - lo) / 1e3)
    ax.set_ylim(-0.6, len(pids) - 0.4)
    ax.set_xlabel(
        f"milliseconds from {start:.1f} ms into the trace (triangle: the last arriver of a collective; "
        f"diamond: an instant, e.g. a checkpoint; arrows: messages from send to take)",
        fontsize=8,
    )
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=dpi)
    tmp.replace(out)
    return out


def _arrows(ax: Any, events: list[dict], row: Mapping[int, int], lo: float, hi: float) -> None:
    ends: dict[Any, dict] = {}
    for e in events:
        if e.get("ph") in ("s", "f"):
            ends.setdefault(e["id"], {})[e["ph"]] = e
    for pair in ends.values():
        if "s" not in pair or "f" not in pair:
            continue
        tail, head = pair["s"], pair["f"]
        if not (lo <= tail["ts"] <= hi and lo <= head["ts"] <= hi) or tail["pid"] not in row or head["pid"] not in row:
            continue
        ax.annotate(
            "",
            xy=((head["ts"] - lo) / 1e3, row[head["pid"]]),
            xytext=((tail["ts"] - lo) / 1e3, row[tail["pid"]]),
            arrowprops={"arrowstyle": "->", "color": "0.3", "linewidth": 0.6},
        )
