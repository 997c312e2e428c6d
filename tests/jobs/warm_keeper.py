"""A rank keeper for tests/test_warm_start.py: ``python -m tests.jobs.warm_keeper MODE``.

It asks the warm parent named in ``$GFLOWDIST_WARM_PARENT`` to fork :mod:`tests.jobs.warm_rank` with its
arguments, as a real keeper does for ``python -m gflowdist``; where the warm parent refuses, it prints
``cold: WHY`` and exits 3.
"""

from __future__ import annotations

import os
import sys

from gflowdist.cli.warm_keeper import start_warm
from gflowdist.jobenv import WARM_VARIABLE

if __name__ == "__main__":
    why = start_warm(os.environ[WARM_VARIABLE], 5.0, {"WARM_TEST_KEEPER": str(os.getpid())}, "tests.jobs.warm_rank")
    print(f"cold: {why}", flush=True)
    sys.exit(3)
