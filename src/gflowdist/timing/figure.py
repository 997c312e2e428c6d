"""The report's picture, ``report.png``: time per rank, the wait matrix, training curves.

matplotlib is a dependency of gflowdist, imported only here and only when a
figure is drawn (never on the way to the first training step). Should it not
import (a broken environment), :func:`figure_unavailable_reason` says why and
:meth:`Report.save` writes the text and JSON only. The figure is drawn with matplotlib's object API
(``matplotlib.figure.Figure``), so it never touches pyplot's global state or
the user's interactive backend.

Panels:
    top left: one stacked bar per rank; for each role/phase a solid segment of
        its busy seconds (``sum_i t[r][i]``) and a hatched segment of its idle
        seconds (``sum_i (max_i - t[r][i])``).
    top right: the who-waited-on-whom matrix as a heatmap (row waits on column).
    bottom: up to :data:`MAX_CURVES` training curves, one panel each.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gflowdist.timing.report import Report

__all__ = ["figure_unavailable_reason", "save_figure", "MAX_CURVES"]

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


def save_figure(report: Report, path: str | Path, *, dpi: int = 110) -> Path:
    """Draw ``report`` into a PNG at ``path`` and return the path.

    Raises ImportError when matplotlib is missing (check
    :func:`figure_unavailable_reason` first).
    """
    from matplotlib.figure import Figure

    n_curves = min(len(report.curves), MAX_CURVES)
    fig = Figure(figsize=(13.0, 8.5 if n_curves else 5.0))
    # fixed margins, not layout="constrained": every run draws this figure, and the constraint
    # solver took half of the drawing time
    columns = max(n_curves, 1) * 2
    grid = fig.add_gridspec(
        2 if n_curves else 1,
        columns,
        left=0.05,
        right=0.97,
        bottom=0.07 if n_curves else 0.13,
        top=0.9 if n_curves else 0.85,
        hspace=0.38,
        wspace=0.14 * columns,
    )
    _draw_time_bars(fig.add_subplot(grid[0, : columns // 2]), report)
    _draw_wait_matrix(fig, fig.add_subplot(grid[0, columns // 2 :]), report)
    for i, name in enumerate(list(report.curves)[:n_curves]):
        _draw_curve(fig.add_subplot(grid[1, 2 * i : 2 * i + 2]), name, report.curves[name])
    fig.suptitle("gflowdist run report")
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=dpi)
    tmp.replace(out)
    return out


def _draw_time_bars(ax: Any, report: Report) -> None:
    from matplotlib import colormaps

    ranks = sorted({r for phases in report.imbalance.values() for p in phases for r in p.ranks})
    ax.set_title("time per rank: busy (solid) and idle (hatched) per phase")
    if not ranks:
        ax.text(0.5, 0.5, "no phase timings recorded", ha="center", va="center", transform=ax.transAxes)
        return
    position = {rank: i for i, rank in enumerate(ranks)}
    bottoms = [0.0] * len(ranks)
    segments = [(role, p) for role, phases in report.imbalance.items() for p in phases]
    # distinct colours: matplotlib's 10-colour cycle while it suffices, then tab20's dark ten and its light ten
    colors = (
        [f"C{i}" for i in range(len(segments))]
        if len(segments) <= 10
        else [colormaps["tab20"]((2 * i) % 20 + (i // 10) % 2) for i in range(len(segments))]
    )
    for index, ((role, p), color) in enumerate(zip(segments, colors, strict=False)):
        for part, hatch, alpha in (("busy", None, 1.0), ("idle", "//", 0.35)):
            values = getattr(p, part)
            heights = [0.0] * len(ranks)
            for rank, seconds in values.items():
                heights[position[rank]] = seconds
            ax.bar(
                range(len(ranks)),
                heights,
                bottom=bottoms,
                color=color,
                alpha=alpha,
                hatch=hatch,
                edgecolor=color if hatch else None,
                label=f"{role}/{p.phase}" if part == "busy" else ("idle (hatched)" if index == 0 else None),
            )
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=False)]
    ax.set_xticks(range(len(ranks)))
    ax.set_xticklabels([f"{r}\n{report.roles.get(r, '?')}" for r in ranks], fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_ylim(0.0, max(max(bottoms), 1e-9) * 1.3)  # headroom for the legend
    ax.legend(fontsize=7, loc="upper right")


def _draw_wait_matrix(fig: Any, ax: Any, report: Report) -> None:
    w = report.waits
    ax.set_title("seconds blocked: row waited on column")
    if not w.by_label:
        ax.text(0.5, 0.5, "no waits recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    matrix = w.matrix()
    image = ax.imshow(matrix, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax, label="seconds")
    labels = [str(r) for r in w.ranks]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("rank waited on")
    ax.set_ylabel("waiting rank")
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
                        color="black" if seconds > 0.6 * top else "white",
                    )


def _draw_curve(ax: Any, name: str, curve: Any) -> None:
    xs = list(curve["x"])
    ys = [float("nan") if y is None else y for y in curve["y"]]
    ax.plot(xs, ys, linewidth=1.2)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)
