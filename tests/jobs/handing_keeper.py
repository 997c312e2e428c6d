"""A rank's keeper as ``gflowdist run`` is one (tests/test_warm_start.py), with two spies: on its try to hand the rank
to the warm parent (what was loaded by then; whether the try returned) and on the command's own keeper, which it
reaches only where the warm parent did not start the rank (it says what the rank would start with, then ends)."""

from __future__ import annotations

import json
import os
import sys

import gflowdist.cli.rank_keeper as keeper
from gflowdist.cli import main
from gflowdist.jobenv import START_VARIABLE, WARM_VARIABLE

HEAVY = ("yaml", "gflowdist.config", "gflowdist.cli.run_cmd", "gflowdist.cli.doctor_cmd")
real_try = keeper._try_warm


def spy_try(bound_s: float, *, by_signal: bool) -> None:
    loaded = [name for name in HEAVY if name in sys.modules]
    print(json.dumps({"tried": bound_s, "by_signal": by_signal, "loaded": loaded}), flush=True)
    real_try(bound_s, by_signal=by_signal)  # handed over, the keeper ends in it with the rank's status
    print(json.dumps({"returned": os.environ.get(START_VARIABLE)}), flush=True)


def spy_keep(bound_s: float, **_: object) -> None:
    """The command's own keeper: say what the rank would start with, then stop."""
    start = os.environ.get(START_VARIABLE)
    print(json.dumps({"keep": bound_s, "warm": os.environ.get(WARM_VARIABLE), "start": start}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    keeper._try_warm, keeper.keep = spy_try, spy_keep  # type: ignore[assignment]
    sys.argv = ["gflowdist", "run", *sys.argv[1:]]
    sys.exit(main())
