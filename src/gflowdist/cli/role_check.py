"""Import the configured role classes and check them: ``python -m gflowdist.cli.role_check``.

``gflowdist run`` and ``gflowdist layout`` run this in a child Python before
they launch anything (see :mod:`gflowdist.cli.preflight`): importing a role
module imports torch and whatever else the module does at import time
(a CUDA context, MPI), which the launcher process should not carry.

Command line: ``CONFIG_FILE [--count-cuda] ROLE=REF ...``. The child prints one line
starting with :data:`VERDICT_MARK` followed by JSON, ``{"ok": true, "files":
{...}}`` (every module file the imports loaded, for
:mod:`gflowdist.cli.role_cache`) or ``{"error": "<the ConfigError's text>"}``;
anything the user's modules print while being imported comes before it. With
``--count-cuda`` a passing verdict also holds ``"cuda_devices"``: how many CUDA
devices torch sees here (for ``launch.devices``, :func:`gflowdist.cli.preflight.check_devices`).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gflowdist.errors import ConfigError

__all__ = [
    "check_role_class",
    "missing_methods",
    "cuda_device_count",
    "REQUIRED_METHODS",
    "VERDICT_MARK",
    "COUNT_CUDA",
    "main",
]

VERDICT_MARK = "gflowdist role check: "

#: The flag asking the child to count the CUDA devices it sees, as a rank would (:func:`cuda_device_count`).
COUNT_CUDA = "--count-cuda"

#: What a role class must implement itself (abstract in its base class, gflowdist.runtime.roles).
REQUIRED_METHODS = {"trainer": ("rollout", "loss"), "actor": ("rollout",), "buffer": (), "coordinator": ()}


def _base_class(role: str) -> type:
    from gflowdist.runtime import roles

    return {
        "trainer": roles.Trainer,
        "actor": roles.Actor,
        "buffer": roles.BufferManager,
        "coordinator": roles.Coordinator,
    }[role]


def missing_methods(cls: type, role: str) -> list[str]:
    """The methods ``role`` needs that ``cls`` leaves to the framework's base class (or abstract)."""
    from gflowdist.runtime import roles

    missing = set(getattr(cls, "__abstractmethods__", ()))
    for name in REQUIRED_METHODS[role]:
        if getattr(cls, name, None) is getattr(roles.Trainer, name, None):
            missing.add(name)
    return sorted(missing)


def check_role_class(role: str, ref: str, file: str | None) -> type:
    """Import ``ref`` for ``roles.<role>``: a subclass of that role implementing what it must."""
    from gflowdist.config import load_class

    base = _base_class(role)
    key = f"roles.{role}"
    try:
        cls = load_class(ref, key=key, file=file, base=base)
    except SystemExit as exit_request:  # sys.exit() at import time: not an Exception, still the module's fault
        raise ConfigError(f"importing '{ref}' called sys.exit({exit_request.code!r})", key=key, file=file) from None
    missing = missing_methods(cls, role)
    if missing:
        names = " and ".join(f"{name}()" for name in missing)
        raise ConfigError(
            f"'{ref}' does not implement {names}, which every {role} needs (see gflowdist.runtime.{base.__name__})",
            key=key,
            file=file,
        )
    return cls


def cuda_device_count() -> int:
    """The CUDA devices torch sees in this process, counted as a rank counts them
    (:func:`gflowdist.runtime.device_setup.setup_device`)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main(argv: list[str]) -> int:
    """Check every ``ROLE=REF`` of ``argv[1:]`` against config file ``argv[0]``; print the verdict."""
    file = argv[0] or None
    count_cuda = COUNT_CUDA in argv[1:]
    try:
        for pair in argv[1:]:
            if pair == COUNT_CUDA:
                continue
            role, _, ref = pair.partition("=")
            check_role_class(role, ref, file)
    except ConfigError as err:
        verdict: dict[str, Any] = {"error": str(err)}
    else:
        from gflowdist.cli.role_cache import loaded_files

        verdict = {"ok": True, "files": loaded_files()}
        if count_cuda:
            verdict["cuda_devices"] = cuda_device_count()
    sys.stdout.flush()
    print(VERDICT_MARK + json.dumps(verdict), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
