"""The tables, the summary line and the plot of ``benchmarks/latency.py`` (its runs' dicts in, lines out).

Kept apart from the runs, so that each file reads as one thing; ``latency.py``
imports from here what it prints.
"""

from __future__ import annotations

from pathlib import Path

import inference_compare
import latency_peer
from gflowdist.timing.text_table import table_lines

__all__ = [
    "apex_one_rate",
    "cartpole_table",
    "fmt",
    "hypergrid_table",
    "ideal",
    "load_cell",
    "plot",
    "ratio",
    "summary_line",
    "where_lines",
]


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def load_cell(load: tuple[float, float]) -> str:
    return f"{load[0]:.1f}-{load[1]:.1f}"


def cartpole_table(single: dict, apex: list[dict], peers: list[dict] | None = None) -> list[str]:
    rows = []
    for r in [single, *apex, *(peers or [])]:
        rows.append(
            [
                r["name"],
                fmt(r["env_per_s"], ",.0f"),
                fmt(ratio(r["env_per_s"], single["env_per_s"]), ".2f", "x"),
                fmt(ideal(r["actors"], apex), ",.0f"),
                fmt(r.get("wait_pct"), ".0f", "%"),
                fmt(r["time_to_target"], ".1f"),
                fmt(ratio(r["time_to_target"], single["time_to_target"]), ".2f", "x"),
                fmt(r.get("learner_steps"), ",.0f"),
                fmt(r["wall_s"], ".0f"),
                load_cell(r["load"]),
            ]
        )
    head = [
        "setup",
        "env steps/s",
        "vs single",
        "ideal (N x 1)",
        "actor waiting",
        "time to target s",
        "vs single",
        "learner steps",
        "wall s",
        "load",
    ]
    return table_lines(head, rows)


def ideal(actors: int, apex: list[dict]) -> float | None:
    """``actors`` x one actor's env steps/s (None without a 1-actor run, or for the single process)."""
    one = apex_one_rate(apex)
    return actors * one if actors and one is not None else None


def apex_one_rate(apex: list[dict]) -> float | None:
    return next((r["env_per_s"] for r in apex if r["actors"] == 1), None)


def hypergrid_table(bare: dict, runs: list[dict]) -> list[str]:
    rows = [
        [
            r["name"],
            str(r["ranks"]),
            fmt(r["traj_per_s"], ",.0f"),
            fmt(ratio(r["traj_per_s"], bare["traj_per_s"]), ".2f", "x"),
            fmt(r["time_to_l1"], ".1f"),
            fmt(ratio(r["time_to_l1"], bare["time_to_l1"]), ".2f", "x"),
            fmt(r["wall_s"], ".0f"),
            load_cell(r["load"]),
        ]
        for r in [bare, *runs]
    ]
    head = ["setup", "ranks", "traj/s", "vs bare", "time to L1 s", "vs bare", "wall s", "load"]
    return table_lines(head, rows)


def where_lines(runs: list[dict]) -> list[str]:
    """Each distributed run's phase shares per role, from its finals.json (the report's timing)."""
    lines = []
    for r in runs:
        parts = []
        for role in ("actor", "trainer", "buffer"):
            shares = r.get("where", {}).get(role)
            if shares:
                top = sorted(shares.items(), key=lambda kv: -kv[1])[:4]
                parts.append(f"{role} " + ", ".join(f"{name} {share:.0f}%" for name, share in top))
        if parts:
            lines.append(f"  {r['name']}: " + "; ".join(parts))
    return lines


def summary_line(
    single: dict,
    apex: list[dict],
    target_actors: int,
    bare: dict | None,
    gfn: list[dict],
    inference: list[dict],
    peer: dict | None = None,
    peer_actors: int = 4,
) -> str:
    by_actors = {r["actors"]: r for r in apex}

    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    parts = [
        f"actors{n} {x(ratio(by_actors[n]['env_per_s'], single['env_per_s']) if n in by_actors else None)}"
        for n in (4, 8)
    ]
    target = by_actors.get(target_actors)
    parts.append(f"time_to_target {x(ratio(target['time_to_target'], single['time_to_target']) if target else None)}")
    best = min((r["time_to_l1"] for r in gfn if r["time_to_l1"] is not None), default=None)
    parts.append(f"oracle {x(ratio(best, bare['time_to_l1']) if bare else None)}")
    parts.append(f"inference {x(inference_compare.inference_ratio(inference)) if inference else 'not-run'}")
    parts.append(f"rllib {latency_peer.peer_cell(peer, by_actors.get(peer_actors))}")
    return "latency: " + " ".join(parts)


def plot(
    single: dict,
    apex: list[dict],
    path: Path,
    title: str,
    impala_single: dict | None = None,
    impala: list[dict] | None = None,
) -> None:
    """Env steps/s against actors with the ideal line (N x the 1-actor run) and the single process: one panel for
    Ape-X and, when its rows are given, one for IMPALA (each against its own single process)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("Ape-X", single, apex)]
    if impala and impala_single is not None:
        panels.append(("IMPALA", impala_single, impala))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), dpi=110, squeeze=False)
    for ax, (name, base, runs) in zip(axes[0], panels, strict=True):
        counts = [r["actors"] for r in runs]
        one = apex_one_rate(runs) or base["env_per_s"]
        ax.plot(counts, [one * n for n in counts], "--", color="grey", label="ideal: N x one actor")
        ax.plot(counts, [r["env_per_s"] for r in runs], "o-", label=f"{name}, N actors")
        ax.axhline(base["env_per_s"], color="tab:red", linestyle=":", label=f"single process ({name})")
        ax.set_xlabel("actors (each with the single process's environments)")
        ax.set_ylabel("environment steps/s")
        ax.set_xticks(counts)
        ax.set_title(name, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
