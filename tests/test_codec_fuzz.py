"""A quick seeded slice of the mutation fuzzer (benchmarks/fuzz_codec.py runs >= 100,000 cases)."""

from __future__ import annotations

import runpy
import types
from pathlib import Path

from gflowdist.transport import decode

FUZZER_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz_codec.py"


fuzz_codec = types.SimpleNamespace(**runpy.run_path(str(FUZZER_PATH)))


def test_corpus_is_valid():
    for data in fuzz_codec.corpus():
        assert decode(data, sender=fuzz_codec.SENDER).sender == fuzz_codec.SENDER


def test_mutated_messages_only_decode_or_raise_protocol_error():
    outcomes, per_mutation, reasons, failures = fuzz_codec.run(3000, seed=0)
    assert failures == [] and outcomes["failure"] == 0
    assert sum(outcomes.values()) == 3000
    # The slice is only useful if it reaches both sides: some mutations stay valid, most are refused.
    assert outcomes["ok"] > 0 and outcomes["ProtocolError"] > outcomes["ok"]
    assert {name for name, _ in per_mutation} == set(fuzz_codec.MUTATIONS)
    assert len(reasons) > 20  # many different checks were reached, not just the length check


def test_fuzzer_reports_failures(monkeypatch):
    """If decode let another exception escape, the fuzzer would count it and exit 1."""

    def broken_decode(data, *, sender):
        raise IndexError("escaped")

    monkeypatch.setitem(fuzz_codec.run.__globals__, "decode", broken_decode)
    outcomes, _, _, failures = fuzz_codec.run(10, seed=1)
    assert outcomes["failure"] == 10 and failures[0].startswith("IndexError: escaped")
    assert fuzz_codec.main(["--cases", "5"]) == 1
