"""How long ``gflowdist run`` takes to refuse a mistake (before launching anything), against baselines.

    python benchmarks/prelaunch.py            # 5 rounds of every case, about a minute idle
    python benchmarks/prelaunch.py --rounds 1 # a smoke run

Every case is the README's quick-start (``my_roles.py`` + ``config.yaml``) with
one thing wrong, run as ``python -m gflowdist run ...`` in a fresh folder, as
in ``tests/test_cli_prelaunch.py``; ``GFLOWDIST_MPIEXEC`` points at a fake
mpiexec that answers ``--version`` and exits, so the good config ("launches")
costs what the checks cost and nothing more. Baselines in the same run:
``python -c pass`` (an interpreter), ``python -m gflowdist --help`` (the CLI),
``python -c "import torch"`` (what a role module that imports torch costs at
the least). The table gives the median and the slowest of ``--rounds``
rounds, and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gflowdist.jobenv import without_launcher

REPO = Path(__file__).resolve().parents[1]
_README = (REPO / "README.md").read_text()
ROLES = re.findall(r"```python\n(.*?)```", _README, re.S)[0]
CONFIG = re.findall(r"```yaml\n(.*?)```", _README, re.S)[0]
FAKE_MPIEXEC = '#!/bin/sh\n[ "$1" = "--version" ] && echo "HYDRA fake" && exit 0\nexit 0\n'

#: name -> (file edits, arguments after `gflowdist run`, environment)
CASES = {
    "misspelt role class": ({"config.yaml": ("ArmTrainer", "ArmTrainr")}, ["config.yaml"], {}),
    "missing role file": ({"config.yaml": ("trainer: my_roles.py", "trainer: my_role.py")}, ["config.yaml"], {}),
    "layout needs more ranks": ({}, ["config.yaml", "-n", "2", "layout.trainers=2"], {}),
    "-n 0": ({}, ["config.yaml", "-n", "0"], {}),
    "launch.mpiexec missing": ({}, ["config.yaml", "launch.mpiexec=/nonexistent"], {}),
    "empty config": ({"config.yaml": None}, ["config.yaml"], {}),
    "override typed 'run.steps 5'": ({}, ["config.yaml", "run.steps", "5"], {}),
    "role module raises at import": (
        {"my_roles.py": ("class ArmBuffer", "raise RuntimeError('x')\nclass ArmBuffer")},
        ["config.yaml"],
        {},
    ),
    "class is no Trainer": ({"my_roles.py": ("class ArmTrainer(Trainer):", "class ArmTrainer:")}, ["config.yaml"], {}),
    "good config, first launch (role check runs)": ({}, ["config.yaml"], {"GFLOWDIST_ROLE_CHECK_CACHE": "0"}),
    "good config, role check remembered": ({}, ["config.yaml"], {}),
}


def _folder(root: Path, name: str, edits: dict) -> Path:
    folder = Path(tempfile.mkdtemp(dir=root))
    files = {"my_roles.py": ROLES, "config.yaml": CONFIG}
    for file, change in edits.items():
        files[file] = "# empty\n" if change is None else files[file].replace(*change)
    for file, text in files.items():
        (folder / file).write_text(text)
    fake = folder / "mpiexec"
    fake.write_text(FAKE_MPIEXEC)
    fake.chmod(0o755)
    return folder


def _time(argv: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=300, check=False)
    return time.perf_counter() - start


def measure(rounds: int) -> dict[str, list[float]]:
    """``{case or baseline: [seconds per round]}``; cases and baselines interleaved round by round."""
    python = sys.executable
    baselines = {
        "baseline: python -c pass": [python, "-c", "pass"],
        "baseline: python -m gflowdist --help": [python, "-m", "gflowdist", "--help"],
        "baseline: python -c 'import torch'": [python, "-c", "import torch"],
    }
    times: dict[str, list[float]] = {name: [] for name in [*baselines, *CASES]}
    with tempfile.TemporaryDirectory() as root:
        base_env = dict(without_launcher(dict(os.environ)), XDG_CACHE_HOME=str(Path(root) / "cache"))
        folders = {name: _folder(Path(root), name, edits) for name, (edits, _, _) in CASES.items()}
        warm = folders["good config, role check remembered"]
        subprocess.run(
            [python, "-m", "gflowdist", "run", "config.yaml"],
            cwd=warm,
            capture_output=True,
            env=dict(base_env, GFLOWDIST_MPIEXEC=str(warm / "mpiexec")),
            timeout=300,
            check=False,
        )
        for _ in range(rounds):
            for name, argv in baselines.items():
                times[name].append(_time(argv, Path(root), base_env))
            for name, (_, args, extra) in CASES.items():
                env = dict(base_env, GFLOWDIST_MPIEXEC=str(folders[name] / "mpiexec"), **extra)
                times[name].append(_time([python, "-m", "gflowdist", "run", *args], folders[name], env))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="runs of every case (default 5)")
    rounds = parser.parse_args().rounds
    before = os.getloadavg()
    times = measure(rounds)
    after = os.getloadavg()
    width = max(len(name) for name in times)
    print(
        f"gflowdist run: time to refuse a mistake ({rounds} rounds; load average "
        f"{before[0]:.1f} before, {after[0]:.1f} after)"
    )
    print(f"{'case':<{width}}  median s  slowest s")
    for name, values in times.items():
        print(f"{name:<{width}}  {statistics.median(values):8.2f}  {max(values):9.2f}")


if __name__ == "__main__":
    main()
