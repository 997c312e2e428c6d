"""``python -m gflowdist ...`` is the ``gflowdist`` command."""

from __future__ import annotations

from gflowdist.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
