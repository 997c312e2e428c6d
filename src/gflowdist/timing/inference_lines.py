"""The report's lines about inference ranks (``layout.inference``): batch sizes, queueing delay, stragglers.

Each inference rank's final report carries
:meth:`InferenceStats.to_dict <gflowdist.runtime.loops.inference.InferenceStats.to_dict>`;
:func:`inference_lines` makes the report's section of them and
:func:`inference_stragglers` the stragglers table's lines: an inference rank
whose requests waited longer for their batch, on average, than
``inference.max_delay_ms`` cannot keep up with its actors (its forward takes
longer than the actors take to ask again) and is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["inference_lines", "inference_stragglers"]


def _where(rank: int, hosts: Mapping[int, str]) -> str:
    host = hosts.get(rank)
    return f"rank {rank}" + (f" on {host}" if host else "")


def inference_lines(stats: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str]) -> list[str]:
    """The report's section: per inference rank its batches, their sizes, and the queueing delay."""
    lines = ["Inference (actors' policy run centrally; batch = observations per forward)"]
    for rank, s in sorted(stats.items()):
        sizes = s.get("sizes", {})
        common = sorted(sizes.items(), key=lambda kv: (-kv[1], int(kv[0])))[:4]
        closed = ", ".join(f"{why} {n}" for why, n in sorted(s.get("closed_by", {}).items()))
        lines += [
            f"  {_where(rank, hosts)}: {s.get('batches', 0)} batches of {s.get('requests', 0)} requests, "
            f"{s.get('observations', 0)} observations; batch mean {s.get('mean_batch', 0.0):.1f} "
            f"(max_batch {s.get('max_batch', 0)}), {s.get('mean_requests_per_batch', 0.0):.2f} requests per batch",
            f"    most common batch sizes: {', '.join(f'{k} x{v}' for k, v in common) or 'none'}; "
            f"ran because: {closed or 'never ran'}",
            f"    queueing delay ms: mean {s.get('delay_mean_ms', 0.0):.2f}, p50 {s.get('delay_p50_ms', 0.0):.2f}, "
            f"p95 {s.get('delay_p95_ms', 0.0):.2f}, max {s.get('delay_max_ms', 0.0):.2f} "
            f"(max_delay_ms {s.get('max_delay_ms', 0.0):g}); forward mean {s.get('forward_mean_ms', 0.0):.2f} ms"
            + (f"; refused {s['refused']} requests" if s.get("refused") else ""),
        ]
    return lines


def inference_stragglers(stats: Mapping[int, Mapping[str, Any]], hosts: Mapping[int, str]) -> list[str]:
    """The stragglers table's lines: each inference rank that did not keep up with its actors."""
    lines = []
    for rank, s in sorted(stats.items()):
        mean, bound = float(s.get("delay_mean_ms", 0.0)), float(s.get("max_delay_ms", 0.0))
        if s.get("requests") and mean > bound:
            lines.append(
                f"  inference/queue: {_where(rank, hosts)} kept its actors waiting: requests queued a mean "
                f"{mean:.2f} ms for their batch (inference.max_delay_ms {bound:g}), its forward took a mean "
                f"{float(s.get('forward_mean_ms', 0.0)):.2f} ms"
            )
    return lines
