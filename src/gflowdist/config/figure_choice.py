"""``report.figure``: whether a run draws report.png, and the environment variable that answers its null.

Light on purpose (the launcher checks it before anything starts, and ``gflowdist --help`` imports the
settings): nothing here imports numpy, matplotlib or torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gflowdist.errors import ConfigError

__all__ = ["FIGURE_VARIABLE", "figure_wanted"]

#: The environment variable that answers ``report.figure: null`` (``0`` or ``1``; unset: draw).
FIGURE_VARIABLE = "GFLOWDIST_REPORT_FIGURE"


def figure_wanted(configured: bool | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether a run draws report.png: ``report.figure``, or where it is null :data:`FIGURE_VARIABLE`, else yes.

    A value of the variable other than ``0`` or ``1`` raises :class:`~gflowdist.errors.ConfigError`
    naming it (``gflowdist run`` checks before it launches anything).
    """
    if configured is not None:
        return configured
    value = (os.environ if environ is None else environ).get(FIGURE_VARIABLE)
    if value is None:
        return True
    if value not in ("0", "1"):
        raise ConfigError(
            f"expected 0 or 1 (it answers report.figure: null), found {value!r}",
            key=FIGURE_VARIABLE,
            file="environment",
        )
    return value == "1"
