"""The "rank" tests/test_warm_start.py has the warm parent fork: ``sys.argv[1]`` says what it does.

- ``report``: prints what it inherited as one JSON line and exits 7;
- ``sigterm``: prints ``ready`` (with its pid), then ends with status 0 on SIGTERM, printing ``got SIGTERM``
  (waiting in short sleeps: a signal the kernel hands to the keeper-line thread runs its handler in the main
  thread at the next one, where a long sleep would sleep on);
- ``kill``: SIGKILLs itself;
- ``sleep``: prints ``ready`` (with its pid) and sleeps a minute.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time

from gflowdist.jobenv import START_VARIABLE


def _report() -> None:
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "sid": os.getsid(0),
                "cwd": os.getcwd(),
                "start": os.environ.get(START_VARIABLE),
                "keeper": os.environ.get("WARM_TEST_KEEPER"),
                "probe": os.environ.get("WARM_TEST_PROBE"),
                "fds": fds,
                "torch": "torch" in sys.modules,
                "dynamo": "torch._dynamo" in sys.modules,  # launch.warm_imports' default
                "frozen": gc.get_freeze_count(),  # the warm parent's objects, out of the collector's reach
                "argv": sys.argv,
                "affinity": sorted(os.sched_getaffinity(0)),
            }
        ),
        flush=True,
    )
    sys.exit(7)


def _on_sigterm(_sig: int, _frame: object) -> None:
    print("got SIGTERM", flush=True)
    sys.exit(0)


def main(mode: str) -> None:
    if mode == "report":
        _report()
    elif mode == "sigterm":
        signal.signal(signal.SIGTERM, _on_sigterm)
        print(f"ready {os.getpid()}", flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        print("no SIGTERM in 60 s", flush=True)
        sys.exit(1)
    elif mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "sleep":
        print(f"ready {os.getpid()}", flush=True)
        time.sleep(60)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1])
