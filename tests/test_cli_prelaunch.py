"""A new user's mistakes, through the real ``gflowdist run`` / ``gflowdist layout``: caught before launch.

Every case runs the CLI as a subprocess in a folder holding the README's
roles (``my_roles.py``) and config, with one thing wrong. What the user must
see: exit status 2, exactly one line on stderr naming the file / key / rank
count and the fix, nothing on stdout, no traceback, no ``runs/`` directory,
and no launch: ``GFLOWDIST_MPIEXEC`` points at a fake mpiexec that answers
``--version`` and records any other call, and it must record none. A good
config is the control: the same fake is then called with ``-n 3``, and
the launcher process has not imported torch. Each case keeps its role-check
verdicts in a cache of its own (``XDG_CACHE_HOME``); one test follows that
cache through a change of the role file.

The cases run two at a time in a module fixture; most take a few tenths of a
second (nothing is imported but the config and the CLI). The three that must
import the role module (it raises, a class is no Trainer, a method is
missing) pay for the torch that module imports, in a child Python.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from gflowdist.cli.preflight import ALLOCATION_VARIABLES
from gflowdist.process_tree import is_running
from tests.support.launching import REPO, base_env

README = (REPO / "README.md").read_text()
ROLES = re.findall(r"```python\n(.*?)```", README, re.S)[0]
CONFIG = re.findall(r"```yaml\n(.*?)```", README, re.S)[0]
FAKE_MPIEXEC = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "HYDRA build details: fake for tests"; exit 0; fi
printf '%s\n' "$*" >> "$(dirname "$0")/launched"
"""


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


#: No GPU visible to torch (on any machine), and no batch allocation that could spread the ranks over other hosts.
NO_GPU = {"CUDA_VISIBLE_DEVICES": "", **{name: "" for name in ALLOCATION_VARIABLES}}

#: name -> (files to write besides my_roles.py / config.yaml, command line after `gflowdist`, extra env,
#:          words the one line must contain)
CASES = {
    "misspelt class": (
        {"config.yaml": _replace(CONFIG, "ArmTrainer", "ArmTrainr")},
        ["run", "config.yaml"],
        {},
        ["config.yaml: roles.trainer: 'my_roles.py' has no attribute 'ArmTrainr'", "(did you mean 'ArmTrainer'?)"],
    ),
    "missing role file": (
        {"config.yaml": _replace(CONFIG, "trainer: my_roles.py", "trainer: my_role.py")},
        ["run", "config.yaml"],
        {},
        ["roles.trainer: file 'my_role.py' not found", "(did you mean 'my_roles.py'?)"],
    ),
    "syntax error": (
        {"my_roles.py": _replace(ROLES, "def setup(self):", "def setup(self)")},
        ["run", "config.yaml"],
        {},
        ["roles.trainer: ", "my_roles.py' line 9: expected ':'"],
    ),
    "module raises": (
        {"my_roles.py": ROLES + "\nraise RuntimeError('the data set is missing')\n"},
        ["run", "config.yaml"],
        {},
        ["roles.trainer: running ", "raised RuntimeError: the data set is missing"],
    ),
    "not a trainer": (
        {"my_roles.py": _replace(ROLES, "class ArmTrainer(Trainer):", "class ArmTrainer:")},
        ["run", "config.yaml"],
        {},
        ["roles.trainer: 'my_roles.py:ArmTrainer' must be a subclass of gflowdist.runtime.roles.Trainer"],
    ),
    "no loss()": (
        {"my_roles.py": _replace(ROLES, "def loss(self, batch):", "def los(self, batch):")},
        ["run", "config.yaml"],
        {},
        ["'my_roles.py:ArmTrainer' does not implement loss(), which every trainer needs"],
    ),
    "no trainer class": (
        {"config.yaml": _replace(CONFIG, "trainer: my_roles.py:ArmTrainer, ", "")},
        ["run", "config.yaml"],
        {},
        ["roles.trainer: is not set, but the layout has 1 trainers"],
    ),
    "too few ranks": (
        {},
        ["run", "config.yaml", "-n", "2", "layout.trainers=2"],
        {},
        [
            "layout error: layout needs 2 trainers + 1 buffer + 1 coordinator = 4 ranks but the job "
            "has 2 (-n 2): start -n 4, or change the layout counts in config.yaml"
        ],
    ),
    "-n 0": (
        {},
        ["run", "config.yaml", "-n", "0"],
        {},
        ["gflowdist run: error: argument -n/-np/--nprocs: expected a number of ranks >= 1, found 0"],
    ),
    "-n -3": ({}, ["run", "config.yaml", "-n", "-3"], {}, ["expected a number of ranks >= 1, found -3"]),
    "launch.mpiexec missing": (
        {},
        ["run", "config.yaml", "launch.mpiexec=/nonexistent/mpiexec"],
        {},
        [
            "config.yaml: launch.mpiexec: '/nonexistent/mpiexec' does not exist: set "
            "launch.mpiexec to your site's mpiexec"
        ],
    ),
    "GFLOWDIST_MPIEXEC missing": (
        {},
        ["run", "config.yaml"],
        {"GFLOWDIST_MPIEXEC": "/nonexistent/mpiexec"},
        ["GFLOWDIST_MPIEXEC: '/nonexistent/mpiexec' does not exist: unset GFLOWDIST_MPIEXEC or point it at an mpiexec"],
    ),
    "empty config": (
        {"config.yaml": "# nothing yet\n"},
        ["run", "config.yaml"],
        {},
        ["config.yaml: the file is empty: a config needs at least the role classes"],
    ),
    "space in override": (
        {},
        ["run", "config.yaml", "run.steps", "5"],
        {},
        ["'run.steps' is not an override: write run.steps=5"],
    ),
    "dashed override": (
        {},
        ["run", "config.yaml", "--run.steps=5"],
        {},
        ["'--run.steps=5' is not an option: overrides take no dashes, write run.steps=5"],
    ),
    "--set applied": ({}, ["run", "config.yaml", "--set", "layout.buffers=3", "-n", "3"], {}, ["3 buffers"]),
    "layout checks roles": (
        {"config.yaml": _replace(CONFIG, "ArmTrainer", "ArmTrainr")},
        ["layout", "config.yaml"],
        {},
        [
            "gflowdist layout: config error: config.yaml: roles.trainer: 'my_roles.py' has no "
            "attribute 'ArmTrainr' (did you mean 'ArmTrainer'?)"
        ],
    ),
    "layout positional override": ({}, ["layout", "config.yaml", "layout.buffers=3"], {}, ["3 buffers"]),
    "too many ranks": (
        {},
        ["run", "config.yaml", "-n", "5", "layout.trainers=1"],
        {},
        [
            "layout error: layout accounts for 1 trainer + 1 buffer + 1 coordinator = 3 ranks but the "
            "job has 5 (-n 5): start -n 3, or give one count as 'rest' in config.yaml"
        ],
    ),
    "colon override": (
        {},
        ["run", "config.yaml", "run.steps:5"],
        {},
        ["'run.steps:5' is YAML, not an override: write run.steps=5 "],
    ),
    "--set colon override": (
        {},
        ["run", "--set", "run.steps:5", "config.yaml"],
        {},
        ["'run.steps:5' is YAML, not an override: write run.steps=5 "],
    ),
    "key as an option": (
        {},
        ["run", "config.yaml", "--steps", "5"],
        {},
        ["'--steps' is not an option of gflowdist run: write the override run.steps=5"],
    ),
    "cuda without a GPU": (
        {},
        ["run", "config.yaml", "launch.devices=cuda"],
        NO_GPU,
        [
            "config error: config.yaml: launch.devices: asks for cuda, but this host sees no CUDA "
            "device (local rank 0: 3 ranks, all on this host): set launch.devices to auto or cpu"
        ],
    ),
    "cuda:7 without a GPU": (
        {},
        ["run", "config.yaml", "launch.devices=[cuda:7]"],
        NO_GPU,
        [
            "config.yaml: launch.devices: entry 0 of launch.devices (local rank 0: 3 ranks, all on "
            "this host) is cuda:7, but this host sees 0 visible CUDA devices: set launch.devices"
        ],
    ),
    "cuda without a GPU, torch engine": (
        {},
        ["run", "config.yaml", "launch.devices=cuda", "--engine", "torch"],
        NO_GPU,
        ["config.yaml: launch.devices: asks for cuda, but this host sees no CUDA device"],
    ),
    "replace with --record": (
        {},
        ["run", "config.yaml", "--record", "faults.on_actor_loss=replace", "faults.max_restarts=1"],
        {},
        ["faults.on_actor_loss: is replace, but run.record is true (--record): a replacement actor"],
    ),
    "replace on torch": (
        {},
        ["run", "config.yaml", "--engine", "torch", "faults.on_actor_loss=replace", "faults.max_restarts=1"],
        {},
        ["faults.on_actor_loss: is replace, but launch.engine is torch: a gloo group's world size is fixed"],
    ),
    "replace without restarts": (
        {},
        ["run", "config.yaml", "faults.on_actor_loss=replace"],
        {},
        ["faults.on_actor_loss: is replace, but faults.max_restarts is 0", "set faults.max_restarts to 1 or more"],
    ),
    "replace, launcher without spawn": (
        {},
        ["run", "config.yaml", "faults.on_actor_loss=replace", "faults.max_restarts=1", "launch.mpiexec=/bin/echo"],
        {},
        [
            "config.yaml: faults.on_actor_loss: is replace, but the mpiexec /bin/echo ('echo (GNU coreutils)",
            "MPI_Comm_spawn",
        ],
    ),
    "layout checks devices": (
        {},
        ["layout", "config.yaml", "launch.devices=cuda"],
        NO_GPU,
        [
            "gflowdist layout: config error: config.yaml: launch.devices: asks for cuda, but this "
            "host sees no CUDA device"
        ],
    ),
}


def _fake_mpiexec(folder: Path) -> Path:
    fake = folder / "fake-bin" / "mpiexec"
    fake.parent.mkdir()
    fake.write_text(FAKE_MPIEXEC)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


#: Runs the CLI like ``python -m gflowdist`` and then says whether torch was imported in this process.
PROBE = (
    "import runpy, sys\n"
    "sys.argv = ['gflowdist', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('gflowdist', run_name='__main__')\n"
    "except SystemExit as done:\n"
    "    print('torch imported' if 'torch' in sys.modules else 'no torch', done.code)\n"
)


def _run_case(folder: Path, files: dict, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    (folder / "my_roles.py").write_text(ROLES)
    (folder / "config.yaml").write_text(CONFIG)
    for name, text in files.items():
        (folder / name).write_text(text)
    fake = _fake_mpiexec(folder)
    command = ["-c", PROBE] if folder.name.startswith("control") else ["-m", "gflowdist"]
    return _cli(folder, command + argv, **{"GFLOWDIST_MPIEXEC": str(fake), **env})


def _cli(folder: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    env.setdefault("XDG_CACHE_HOME", str(folder / "cache"))  # role-check verdicts: this folder's own
    return subprocess.run(
        [sys.executable, *argv], cwd=folder, capture_output=True, text=True, env=base_env(**env), timeout=120
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    folders = {
        name: tmp_path_factory.mktemp("control" if name == "control" else "case") for name in ["control", *CASES]
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {"control": pool.submit(_run_case, folders["control"], {}, ["run", "config.yaml"], {})}
        futures.update({name: pool.submit(_run_case, folders[name], *CASES[name][:3]) for name in CASES})
        return {name: (folders[name], future.result()) for name, future in futures.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_a_mistake_is_one_line_exit_2_and_nothing_launched(results, name):
    folder, done = results[name]
    words = CASES[name][3]
    assert done.returncode == 2, done
    assert done.stdout == "", done.stdout
    assert len(done.stderr.splitlines()) == 1 and done.stderr.endswith("\n"), done.stderr
    assert done.stderr.startswith(f"gflowdist {CASES[name][1][0]}: ")
    for word in words:
        assert word in done.stderr
    assert not (folder / "runs").exists()
    assert not (folder / "fake-bin" / "launched").exists(), "mpiexec was started"


def test_a_good_config_passes_every_check_and_launches_without_torch_in_the_launcher(results):
    """The role check imports the user's module (and torch) in a child; the launcher itself stays light."""
    folder, done = results["control"]
    assert done.stdout.split() == ["no", "torch", "0"], done
    launched = (folder / "fake-bin" / "launched").read_text().split()
    assert launched[:2] == ["-n", "3"] and launched[-3:] == ["gflowdist", "run", "config.yaml"], launched


def test_a_passing_role_check_is_remembered_until_a_role_file_changes(results):
    folder, _ = results["control"]
    kept = list((folder / "cache" / "gflowdist" / "role-checks").glob("*.json"))
    assert len(kept) == 1
    written = kept[0].stat().st_mtime_ns
    env = {"GFLOWDIST_MPIEXEC": str(folder / "fake-bin" / "mpiexec")}
    again = _cli(folder, ["-m", "gflowdist", "run", "config.yaml"], **env)
    assert again.returncode == 0, again
    assert kept[0].stat().st_mtime_ns == written  # remembered: no child checked (it would rewrite the verdict)
    with open(folder / "my_roles.py", "a") as roles:
        roles.write("\nraise RuntimeError('changed since the last check')\n")
    changed = _cli(folder, ["-m", "gflowdist", "run", "config.yaml"], **env)
    assert changed.returncode == 2 and "raised RuntimeError: changed since the last check" in changed.stderr, changed
    assert len((folder / "fake-bin" / "launched").read_text().splitlines()) == 2  # the control run and `again`


def test_a_job_that_fails_before_any_rank_writes_leaves_no_run_directory(tmp_path):
    """The launched job fails at once (here: its mpiexec exits 7): the empty run directory goes too."""
    (tmp_path / "my_roles.py").write_text(ROLES)
    (tmp_path / "config.yaml").write_text(CONFIG)
    fake = _fake_mpiexec(tmp_path)
    fake.write_text(FAKE_MPIEXEC + "exit 7\n")
    done = _cli(tmp_path, ["-m", "gflowdist", "run", "config.yaml"], GFLOWDIST_MPIEXEC=str(fake))
    assert done.returncode == 7, done
    assert (tmp_path / "fake-bin" / "launched").exists()  # it was launched: this is no pre-launch check
    assert list((tmp_path / "runs").iterdir()) == []  # runs/arms-<timestamp>/ was made, and removed


HANGING_MPIEXEC = """#!/bin/sh
sleep 100 &
echo $! > "$(dirname "$0")/child.pid"
wait
"""


def test_a_launcher_that_hangs_on_version_is_stopped_after_10_s_with_what_it_started(tmp_path):
    (tmp_path / "my_roles.py").write_text(ROLES)
    (tmp_path / "config.yaml").write_text(CONFIG)
    fake = _fake_mpiexec(tmp_path)
    fake.write_text(HANGING_MPIEXEC)
    child = tmp_path / "fake-bin" / "child.pid"
    began = time.monotonic()
    try:
        done = _cli(tmp_path, ["-m", "gflowdist", "run", "config.yaml", f"launch.mpiexec={fake}"])
        took = time.monotonic() - began
        assert done.returncode == 2, done
        assert done.stderr == (
            f"gflowdist run: config error: config.yaml: launch.mpiexec: '{fake} --version' did not "
            f"answer within 10 s and was stopped: set launch.mpiexec to your site's mpiexec, or "
            f"remove it to use the one next to this Python\n"
        ), done.stderr
        assert took < 20, took
        pid = int(child.read_text())
        deadline = time.monotonic() + 5
        while is_running(pid) and time.monotonic() < deadline:  # killed: gone at once (init reaps it)
            time.sleep(0.05)
        assert not is_running(pid), "the probe's child outlived gflowdist"
        assert not (tmp_path / "runs").exists()
    finally:
        if child.exists() and is_running(int(child.read_text())):
            os.kill(int(child.read_text()), signal.SIGKILL)
