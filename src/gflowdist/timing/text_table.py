"""Plain-text tables for reports: columns padded to their widest cell."""

from __future__ import annotations

from collections.abc import Sequence

from gflowdist.errors import GflowdistError

__all__ = ["table_lines", "rank_list"]


def table_lines(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, align: str = "", indent: str = ""
) -> list[str]:
    """Lines of a table: header, rule, rows; cells padded to the widest in their column.

    ``align`` has one letter per column, ``l`` (left) or ``r`` (right); missing
    letters default to ``l`` for the first column and ``r`` for the others.
    Every row must have ``len(headers)`` cells (already formatted as strings).
    """
    align = align + "".join("l" if i == 0 else "r" for i in range(len(align), len(headers)))
    widths = [len(h) for h in headers]
    for row in rows:
        if len(row) != len(headers):
            raise GflowdistError(f"table row has {len(row)} cells, expected {len(headers)}: {row!r}")
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=False)]

    def fmt(cells: Sequence[str]) -> str:
        parts = [cell.ljust(w) if a == "l" else cell.rjust(w) for a, cell, w in zip(align, cells, widths, strict=False)]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return [fmt(headers), rule, *(fmt(row) for row in rows)]


def rank_list(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"`` (ranks sorted first)."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "-"
    spans: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return ",".join(spans)
