"""build_report: per-role imbalance, waits, staleness, ledger, curves, JSON, save()."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgpack
import pytest

from gflowdist.errors import GflowdistError
from gflowdist.timing import Report, StepTimer, build_report, staleness_summary
from gflowdist.timing import figure as figure_module


def _timer(phases: dict[str, list[float]], waits: list[tuple[int, str, float]] = ()) -> dict:
    timer = StepTimer()
    for name, times in phases.items():
        for seconds in times:
            timer.record(name, seconds)
    for peer, label, seconds in waits:
        timer.record_wait(peer, label, seconds)
    return timer.to_dict()


ROLES = {0: "trainer", 1: "trainer", 2: "trainer", 3: "buffer", 4: "actor", 5: "actor"}
HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-a", 4: "node-b", 5: "node-b"}


def _per_rank() -> dict[int, dict]:
    return {
        # trainers: rollout per iteration (1, 2, 3) -> useful 2, waiting 1 each iteration
        0: _timer({"rollout": [1.0, 1.0], "train": [0.5, 0.5]}, [(3, "sample", 0.5)]),
        1: _timer({"rollout": [2.0, 2.0], "train": [0.5, 0.5]}, [(3, "sample", 1.0)]),
        2: _timer({"rollout": [3.0, 3.0]}, [(3, "sample", 2.0), (0, "allreduce", 0.25)]),
        3: _timer({"serve": [0.25, 0.25, 0.25]}),
        # "5" as a str key: gathered dicts may come back from msgpack/JSON
        4: _timer({"rollout": [1.0]}, [(3, "send", 0.125)]),
    }


LEDGER = {
    "4": {"produced": 50, "sent": 50, "in_flight": 2},
    0: {"produced": 30, "sent": 30},
    3: {"received": 78, "admitted": 70, "dropped": {"duplicate": 5, "capacity": 3}},
}
STALENESS = {0: {"0": 20, "1": 8, "2": 2}, 1: {0: 30}}
METRICS = [
    {"step": 0, "loss": 2.5, "modes": 0},
    {"step": 10, "loss": 1.0, "modes": 3},
    {"step": 20, "loss": 1.5, "modes": 5},
    {"step": 30, "loss": float("nan"), "modes": 4},
]


@pytest.fixture
def report() -> Report:
    return build_report(_per_rank(), roles=ROLES, hosts=HOSTS, ledger=LEDGER, staleness=STALENESS, metrics=METRICS)


def test_imbalance_is_computed_per_role(report: Report) -> None:
    assert list(report.imbalance) == ["trainer", "buffer", "actor"]
    rollout, train = report.imbalance["trainer"]
    assert (rollout.phase, rollout.useful, rollout.waiting) == ("rollout", 4.0, 2.0)
    assert rollout.straggler == 2 and rollout.straggler_iterations == 2
    assert train.missing_ranks == (2,) and train.waiting == 0.0
    assert report.imbalance["actor"][0].ranks == (4,)
    assert report.ranks == (0, 1, 2, 3, 4, 5)


def test_text_contains_the_key_numbers(report: Report) -> None:
    text = report.to_text()
    trainer_block = text.split("[trainer]")[1].split("[buffer]")[0]
    rollout_line = next(line for line in trainer_block.splitlines() if "rollout" in line)
    assert rollout_line.split()[:5] == ["rollout", "2", "4.000", "2.000", "33.3"]
    assert "rank 2 (2/2)" in rollout_line
    assert "[actor] ranks 4 (no timings from 5)" in text
    assert "trainer/rollout: rank 2 on node-b slowest in 2 of 2" in text
    assert "phase 'train' not recorded on ranks 2" in text
    assert "rank 5 has a role but sent no timings" in text


def test_wait_matrix_section(report: Report) -> None:
    m = report.waits
    assert m.ranks == (0, 1, 2, 3, 4)
    assert m.seconds(2, 3) == 2.0 and m.waited_on(3) == 0.5 + 1.0 + 2.0 + 0.125
    assert m.total() == 0.5 + 1.0 + 2.0 + 0.25 + 0.125
    section = report.to_text().split("Who waited on whom")[1].split("Staleness")[0]
    total_row = next(line for line in section.splitlines() if line.startswith("  total"))
    assert total_row.split()[-1] == f"{m.total():.3f}"
    row_2 = next(line for line in section.splitlines() if line.startswith("  2 trainer"))
    assert row_2.split()[2:] == ["0.250", ".", ".", "2.000", ".", "2.250"]


def test_large_world_prints_top_pairs() -> None:
    n = 25
    per_rank = {r: _timer({"p": [1.0]}, [((r + 1) % n, "recv", r + 1.0)]) for r in range(n)}
    text = build_report(per_rank, roles={r: "trainer" for r in range(n)}).to_text()
    total = sum(r + 1.0 for r in range(n))
    assert f"25 ranks: the 20 largest cells, total of all cells {total:.3f} s" in text
    section = text.split("Who waited on whom")[1].split("Staleness")[0]
    first_row = next(line.split() for line in section.splitlines() if "trainer" in line)
    assert first_row == ["24", "trainer", "0", "trainer", "25.000"]


def test_staleness_summary_numbers() -> None:
    s = staleness_summary({"0": 20, "1": 8, "2": 2})
    assert s.count == 30
    assert s.mean == pytest.approx((0 * 20 + 1 * 8 + 2 * 2) / 30)
    assert s.quantile(0.5) == 0  # need ceil(15) = 15 <= 20 at value 0
    assert s.quantile(0.95) == 2  # need ceil(28.5) = 29 > 28 at value 1
    assert s.maximum == 2
    assert staleness_summary({}).mean is None and staleness_summary({}).quantile(0.5) is None
    with pytest.raises(GflowdistError, match="not an int"):
        staleness_summary({"one": 3}, 4)
    with pytest.raises(GflowdistError, match="staleness count of rank 4"):
        staleness_summary({"1": -3}, 4)


def test_staleness_section(report: Report) -> None:
    section = report.to_text().split("Staleness")[1].split("Ledger")[0]
    lines = {line.split()[0]: line.split() for line in section.splitlines()[3:] if line}
    assert lines["0"][2:] == ["30", "0.40", "0", "2", "2"]
    assert lines["1"][2:] == ["30", "0.00", "0", "0", "0"]
    assert lines["all"][1:] == ["60", "0.20", "0", "1", "2"]


def test_ledger_table_and_balance(report: Report) -> None:
    ledger = report.ledger
    assert ledger is not None and ledger.reasons == ["capacity", "duplicate"]
    total = ledger.total
    assert (total.produced, total.admitted, total.dropped_total, total.in_flight) == (80, 70, 8, 2)
    assert ledger.unaccounted == 0 and ledger.balanced
    text = report.to_text()
    assert "produced 80 = admitted 70 + dropped 8 + in flight 2 -> balanced" in text
    assert "sent 80 - received 78 = 2" in text

    unbalanced = build_report({}, roles={}, ledger={0: {"produced": 10, "admitted": 7}})
    assert unbalanced.ledger is not None and unbalanced.ledger.unaccounted == 3
    assert "UNBALANCED: +3 trajectories unaccounted for" in unbalanced.to_text()
    assert "used here" not in report.to_text()  # the column only where something was used locally


def test_trajectories_used_where_they_were_made_balance() -> None:
    """Trainers without a buffer learn from their own rollouts: counted as used here, not unaccounted."""
    ledger = {
        0: {"produced": 48, "used_locally": 48},
        1: {"produced": 48, "used_locally": 40, "sent": 8},
        2: {"received": 8, "admitted": 8},
    }
    report = build_report({}, roles={0: "trainer", 1: "trainer", 2: "buffer"}, ledger=ledger)
    assert report.ledger is not None and report.ledger.balanced and report.ledger.total.used_locally == 88
    text = report.to_text()
    assert "balance: produced 96 = used here 88 + admitted 8 + dropped 0 + in flight 0 -> balanced" in text
    header = next(line for line in text.splitlines() if "produced" in line and "used here" in line)
    assert header.split()[:4] == ["rank", "produced", "sent", "used"]
    missing = build_report({}, roles={}, ledger={0: {"produced": 48, "used_locally": 40}})
    assert missing.ledger is not None and missing.ledger.unaccounted == 8


@pytest.mark.parametrize(
    "bad, message",
    [
        ({0: {"produced": 1, "admited": 1}}, "unknown keys"),
        ({0: {"produced": -1}}, "'produced'"),
        ({0: {"dropped": 3}}, "'dropped' must be"),
        ({"zero": {"produced": 1}}, "rank key"),
    ],
)
def test_ledger_rejects_malformed(bad: dict, message: str) -> None:
    with pytest.raises(GflowdistError, match=message):
        build_report({}, roles={}, ledger=bad)


def test_metric_summaries(report: Report) -> None:
    loss, modes = report.metrics
    assert (loss.first, loss.last, loss.best, loss.goal) == ((0, 2.5), (20, 1.5), (10, 1.0), "min")
    assert loss.nonfinite == 1 and loss.count == 4
    assert (modes.best, modes.goal, modes.last) == ((20, 5), "max", (30, 4))
    assert report.curves["loss"]["y"] == [2.5, 1.0, 1.5, None]
    flipped = build_report({}, roles={}, metrics=METRICS, goals={"modes": "min"})
    assert flipped.metrics[1].best == (0, 0)
    assert "1 @10 (min)" in report.to_text()


def test_metrics_without_step_use_row_index() -> None:
    rep = build_report({}, roles={}, metrics=[{"reward": 1.0}, {"reward": 3.0, "ok": True}])
    assert rep.curves == {"reward": {"x": [0, 1], "y": [1.0, 3.0]}}


def test_roleless_ranks_are_reported_as_unknown() -> None:
    rep = build_report({0: _timer({"p": [1.0]}), 1: _timer({"p": [2.0]})}, roles={0: "trainer"})
    assert list(rep.imbalance) == ["trainer", "unknown"]
    assert "rank 1 has timings but no role" in rep.to_text()


def test_json_and_msgpack_round_trip(report: Report) -> None:
    text = report.to_json()
    assert "NaN" not in text
    again = Report.from_json(text)
    assert again.to_dict() == report.to_dict()
    assert again.to_text() == report.to_text()
    packed = msgpack.unpackb(msgpack.packb(report.to_dict()), strict_map_key=True)
    assert Report.from_dict(packed).to_dict() == report.to_dict()
    with pytest.raises(GflowdistError, match="format"):
        Report.from_dict(dict(report.to_dict(), format=0))
    truncated = report.to_dict()
    del truncated["waits"]
    with pytest.raises(GflowdistError, match=r"malformed.*waits"):
        Report.from_dict(truncated)


def test_bad_timings_name_the_rank() -> None:
    with pytest.raises(GflowdistError, match=r"timings of rank 3: .*unknown keys"):
        build_report({3: {"format": 1, "phase": {}}}, roles={})


def test_empty_report_renders() -> None:
    text = build_report({}, roles={}).to_text()
    for placeholder in ("no phase timings", "no waits recorded", "no staleness", "no ledger given", "no metrics given"):
        assert placeholder in text


def test_save_without_matplotlib(report: Report, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(figure_module, "figure_unavailable_reason", lambda: "matplotlib is not importable (test)")
    saved = report.save(tmp_path / "run")
    assert saved.png_skipped == "matplotlib is not importable (test)"
    assert sorted(p.name for p in saved.paths) == ["report.json", "report.txt"]
    assert not (tmp_path / "run" / "report.png").exists()
    assert (tmp_path / "run" / "report.txt").read_text() == report.to_text() + "\n"
    loaded = json.loads((tmp_path / "run" / "report.json").read_text())
    assert Report.from_dict(loaded).to_dict() == report.to_dict()
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_real_matplotlib_absence_is_explained() -> None:
    reason = figure_module.figure_unavailable_reason()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert reason is not None and "matplotlib" in reason and "pip install" in reason
    else:
        assert reason is None


def test_report_values_are_finite(report: Report) -> None:
    for phases in report.imbalance.values():
        for p in phases:
            assert all(math.isfinite(v) for v in (p.useful, p.waiting, p.waiting_pct))
