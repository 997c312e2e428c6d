"""Remembering that role classes passed their import check, for as long as no file they loaded changes.

Importing a role module costs what its imports cost (torch: about a second).
``gflowdist run`` checks the role classes in a child Python before every
launch (:mod:`gflowdist.cli.role_check`); when they pass, the child lists
every module file that importing them loaded (the user's files, gflowdist,
torch and the rest, with their size and modification time) and this module
keeps that list under :func:`cache_dir`, named by a hash of the role
references (resolved to files) and the Python that ran them. The next launch
with the same references skips the child when every listed file is unchanged
(a ``stat`` of each: milliseconds). Editing a role file, or upgrading a
package the roles import, makes the next launch check again.

What the list cannot see: an import that depends on something other than
module files (an environment variable, a data file read at import time).
Such a module can still fail inside the ranks, as it would without this
check. ``GFLOWDIST_ROLE_CHECK_CACHE=0`` turns remembering off.

Only passing verdicts are kept; a failing check is always run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

__all__ = ["cache_dir", "cache_key", "remembered", "remember", "loaded_files", "CACHE_VARIABLE"]

#: Set to 0 to check the role classes before every launch.
CACHE_VARIABLE = "GFLOWDIST_ROLE_CHECK_CACHE"


def cache_dir() -> Path | None:
    """``$XDG_CACHE_HOME/gflowdist/role-checks`` (default ``~/.cache/...``); None when turned off."""
    if os.environ.get(CACHE_VARIABLE, "1") == "0":
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gflowdist" / "role-checks"


def cache_key(resolved_refs: dict[str, str]) -> str:
    """A hash of ``{role: "<absolute file or module origin>:<Class>"}``, this Python and ``PYTHONPATH``."""
    material = json.dumps(
        {
            "python": sys.executable,
            "version": sys.version,
            "refs": resolved_refs,
            "path": os.environ.get("PYTHONPATH", ""),
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def loaded_files() -> dict[str, list[int]]:
    """``{path: [mtime_ns, size]}`` of every module file this process has loaded (the child calls it)."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        try:
            status = os.stat(path)
        except OSError:
            continue
        files[os.path.abspath(path)] = [status.st_mtime_ns, status.st_size]
    return files


def remembered(key: str) -> bool:
    """Whether a passing verdict for ``key`` is kept and none of its files changed since."""
    folder = cache_dir()
    if folder is None:
        return False
    try:
        files = json.loads((folder / f"{key}.json").read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for path, (mtime_ns, size) in files.items():
        try:
            status = os.stat(path)
        except OSError:
            return False
        if status.st_mtime_ns != mtime_ns or status.st_size != size:
            return False
    return bool(files)


def remember(key: str, files: dict[str, list[int]]) -> None:
    """Keep a passing verdict (written whole, then renamed: concurrent launches never see half a file)."""
    folder = cache_dir()
    if folder is None or not files:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{key}.{os.getpid()}.tmp"
        partial.write_text(json.dumps({"files": files}))
        partial.replace(folder / f"{key}.json")
    except OSError:  # a read-only home: the check simply runs every time
        return
