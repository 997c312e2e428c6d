"""The report's picture, ``report.png``: time per rank, the wait matrix, training curves.

matplotlib is a dependency of gflowdist, imported only here and only when a
figure is drawn (never on the way to the first training step). Should it not
import (a broken environment), :func:`figure_unavailable_reason` says why and
:meth:`Report.save` writes the text and JSON only. The figure is drawn with matplotlib's object API
(``matplotlib.figure.Figure``), so it never touches pyplot's global state or
the user's interactive backend.

Panels:
    top left: one stacked bar per rank; for each role/phase a segment of its
        seconds (``sum_i t[r][i]``), solid where the rank worked, hatched where
        it was idle: a phase in which it waits for work (``idle``, ``wait*``:
        :func:`gflowdist.timing.headline.idle_phase`) and the seconds it waited
        for the slowest rank of its role (``sum_i (max_i - t[r][i])``). The
        key sits beside the bars, never on them.
    top right: the who-waited-on-whom matrix as a heatmap (row waits on
        column), every rank of the run a row and a column, labelled with its role.
    bottom: up to :data:`MAX_CURVES` panels of training curves: ``report.curves``
        when the config chose them (:attr:`Report.shown_curves`), else the
        report's first ones (the coordinator's first, counts last:
        :mod:`gflowdist.timing.curves`); a metric that several roles report is
        one panel with a line per role.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gflowdist.timing.report import Report

__all__ = ["figure_unavailable_reason", "save_figure", "draw_figure", "curve_panels", "MAX_CURVES"]

#: Training curves drawn at most (the first ones, in report order).
MAX_CURVES = 4
#: Matrix cells are annotated with their seconds up to this many ranks.
_ANNOTATE_MAX_RANKS = 10


def figure_unavailable_reason() -> str | None:
    """None when matplotlib imports; otherwise why the PNG cannot be drawn."""
    try:
        importlib.import_module("matplotlib.figure")
    except ImportError as exc:
        return (
            f"matplotlib, a dependency of gflowdist, is not importable ({exc}): "
            f"pip install 'matplotlib>=3.6' to get report.png"
        )
    return None


def curve_panels(report: Report) -> list[tuple[str, list[str]]]:
    """``[(metric, [its curves])]`` the figure draws, at most :data:`MAX_CURVES`: one per metric, with
    the per-role curves of a metric several roles report (``trajectories (actor)``) in one panel."""
    from gflowdist.timing.curves import base_name

    names = [c for c in report.shown_curves if c in report.curves] or list(report.curves)
    panels: dict[str, list[str]] = {}
    for name in names:
        if base_name(name) in panels or len(panels) < MAX_CURVES:
            panels.setdefault(base_name(name), []).append(name)
    return list(panels.items())


def save_figure(report: Report, path: str | Path, *, dpi: int = 110) -> Path:
    """Draw ``report`` into a PNG at ``path`` and return the path.

    Raises ImportError when matplotlib is missing (check
    :func:`figure_unavailable_reason` first).
    """
    fig = draw_figure(report)
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=dpi)
    tmp.replace(out)
    return out


def draw_figure(report: Report) -> Any:
    """The report's ``matplotlib.figure.Figure`` (axes: bars, key, wait matrix [+ colorbar], curves)."""
    from matplotlib.figure import Figure

    panels = curve_panels(report)
    n_curves = len(panels)
    many = len(report.ranks) > 8
    fig = Figure(figsize=(15.0, (9.0 if n_curves else 5.5) + (0.8 if many else 0.0)))
    # fixed margins, not layout="constrained": every run draws this figure, and the constraint
    # solver took half of the drawing time
    grid = fig.add_gridspec(
        2 if n_curves else 1,
        12,
        left=0.05,
        right=0.97,
        bottom=0.07 if n_curves else 0.2,
        top=0.92 if n_curves else 0.86,
        hspace=0.55 if many else 0.4,
        wspace=1.2,
        height_ratios=(1.25, 1.0) if n_curves else None,
    )
    handles = _draw_time_bars(fig.add_subplot(grid[0, 0:5]), report)
    _draw_key(fig.add_subplot(grid[0, 5:7]), handles)
    _draw_wait_matrix(fig, fig.add_subplot(grid[0, 7:12]), report)
    width = 12 // max(n_curves, 1)
    for i, (name, curves) in enumerate(panels):
        _draw_curves(fig.add_subplot(grid[1, i * width : (i + 1) * width]), name, curves, report)
    fig.suptitle(
        "gflowdist run report"
        + (f" -- generation {report.generation}" if report.generation else "")
        + (f" -- PARTIAL: {report.failure[0]}" if report.failure else "")
    )
    return fig


def _rank_label(report: Report, rank: int) -> str:
    return f"{rank} {report.roles.get(rank, '?')}"


def _draw_time_bars(ax: Any, report: Report) -> list[Any]:
    """The bars; returns the key's handles (one per role/phase, and what solid and hatched mean)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    from gflowdist.timing.headline import idle_phase

    ranks = sorted({r for phases in report.imbalance.values() for p in phases for r in p.ranks})
    ax.set_title("time per rank: working (solid), idle (hatched)", fontsize=10)
    if not ranks:
        ax.text(0.5, 0.5, "no phase timings recorded", ha="center", va="center", transform=ax.transAxes)
        return []
    position = {rank: i for i, rank in enumerate(ranks)}
    bottoms = [0.0] * len(ranks)
    segments = [(role, p) for role, phases in report.imbalance.items() for p in phases]
    # distinct colours: matplotlib's 10-colour cycle while it suffices, then tab20's dark ten and its light ten
    colors: list[Any] = (
        [f"C{i}" for i in range(len(segments))]
        if len(segments) <= 10
        else [colormaps["tab20"]((2 * i) % 20 + (i // 10) % 2) for i in range(len(segments))]
    )
    handles = [
        Patch(facecolor="black", edgecolor="black", label="solid: working"),
        Patch(facecolor="white", edgecolor="black", hatch="///", label="hatched: idle, waiting"),
    ]
    for (role, p), color in zip(segments, colors, strict=False):
        idle_kind = idle_phase(p.phase)
        for part in ("busy", "idle"):
            heights = [0.0] * len(ranks)
            for rank, seconds in getattr(p, part).items():
                heights[position[rank]] = seconds
            hatched = idle_kind or part == "idle"
            ax.bar(
                range(len(ranks)),
                heights,
                bottom=bottoms,
                facecolor=to_rgba(color, 0.2) if hatched else color,
                edgecolor=color,
                hatch="///" if hatched else None,
                linewidth=0.0,
            )
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=False)]
        handles.append(
            Patch(
                facecolor=to_rgba(color, 0.2) if idle_kind else color,
                edgecolor=color,
                hatch="///" if idle_kind else None,
                label=f"{role}/{p.phase}",
            )
        )
    ax.set_xticks(range(len(ranks)))
    if len(ranks) > 8:
        ax.set_xticklabels([_rank_label(report, r) for r in ranks], fontsize=7, rotation=90)
    else:
        ax.set_xticklabels([f"{r}\n{report.roles.get(r, '?')}" for r in ranks], fontsize=8)
    ax.set_xlim(-0.6, len(ranks) - 0.4)
    ax.set_ylabel("seconds")
    ax.set_ylim(0.0, max(max(bottoms), 1e-9) * 1.05)
    return handles


def _draw_key(ax: Any, handles: list[Any]) -> None:
    """The bars' key, in an axes of its own beside them."""
    ax.set_axis_off()
    if handles:
        ax.legend(
            handles=handles,
            loc="upper left",
            fontsize=7,
            frameon=False,
            ncol=1 if len(handles) <= 22 else 2,
            borderaxespad=0.0,
            handlelength=1.6,
        )


def _draw_wait_matrix(fig: Any, ax: Any, report: Report) -> None:
    w = report.waits
    ax.set_title("seconds blocked: row (waiting) on column", fontsize=10)
    if not w.by_label:
        ax.text(0.5, 0.5, "no waits recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ranks = sorted(set(report.ranks) | set(w.ranks))  # every rank, also those that never waited
    matrix = [[w.seconds(a, b) for b in ranks] for a in ranks]
    image = ax.imshow(matrix, cmap="YlOrRd", aspect="auto", vmin=0.0)
    fig.colorbar(image, ax=ax, label="seconds")
    labels = [_rank_label(report, r) for r in ranks]
    size = 8 if len(ranks) <= 8 else 6
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=size, rotation=90)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=size)
    ax.set_xlabel("rank waited on", fontsize=8)
    ax.set_ylabel("waiting rank", fontsize=8)
    if len(labels) <= _ANNOTATE_MAX_RANKS:
        top = max(max(row) for row in matrix) or 1.0
        for i, row in enumerate(matrix):
            for j, seconds in enumerate(row):
                if seconds > 0.0:
                    ax.text(
                        j,
                        i,
                        f"{seconds:.2g}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if seconds > 0.6 * top else "black",
                    )


def _draw_curves(ax: Any, name: str, curves: list[str], report: Report) -> None:
    """One metric: a line per curve (per role, for a metric several roles report)."""
    for curve_name in curves:
        curve = report.curves[curve_name]
        xs = list(curve["x"])
        ys = [float("nan") if y is None else y for y in curve["y"]]
        label = curve_name[len(name) :].strip(" ()") or name
        ax.plot(xs, ys, linewidth=1.2, label=label, marker="." if len(xs) < 3 else None)
    if len(curves) > 1:
        ax.legend(fontsize=7)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
