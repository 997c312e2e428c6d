"""One owner for a job's communicators: gflowdist.comm.session.

The world cache is one (``world_comm`` and torchgfn's backend names answer
from it), a session's teardown runs in the documented order, a rank that is
a thread has a session of its own, and two local-engine jobs run one after
another in one process leave nothing behind.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

import gflowdist.ops as ops
from gflowdist.comm import Communicator, LocalComm, release_world_comm, reset_world_comm, world_comm
from gflowdist.comm.session import Session, bound_session, current_session
from gflowdist.comm.threads import ThreadWorld
from gflowdist.compat.torchgfn_groups import known_world, world_for
from gflowdist.config import Config
from gflowdist.engines import LOCAL, MPI, TORCH, detect
from gflowdist.runtime.in_process import run_in_process

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "jobs" / "toy.yaml"


@pytest.fixture
def fresh_session():
    """The process's session emptied before and after the test (nothing of another test's world is seen)."""
    release_world_comm()
    yield current_session()
    release_world_comm()


class Recorded(LocalComm):
    """A world of one whose ``free`` writes down when it ran, and what the session still held then."""

    def __init__(self, name: str, log: list[tuple[str, int]], session: Session, *, engine: str = LOCAL.name):
        super().__init__()
        self.name, self.log, self.session, self.engine = name, log, session, engine

    def free(self, timeout: float | None = None) -> None:
        self.log.append((self.name, len(self.session.axes)))


def test_world_comm_and_the_torchgfn_names_answer_from_one_cache(fresh_session):
    assert detect() is LOCAL  # a plain process: no launcher variables, no process group
    world = world_comm()
    assert world is world_comm() is fresh_session.job_world
    # in a world of one both torchgfn names mean the job's world: the same object, not a second cache
    assert world_for(MPI.name) is world and world_for(TORCH.name) is world
    assert known_world(MPI.name) is None  # a plain process remembers no MPI world beside its own
    assert fresh_session.holdings()["worlds"] == 1
    reset_world_comm()  # forgets, frees nothing: the next ask opens a new world
    assert fresh_session.holdings()["worlds"] == 0 and world_comm() is not world


def test_an_unknown_engine_names_the_key(fresh_session):
    from gflowdist.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown engine 'nccl'") as caught:
        world_comm("nccl")
    assert caught.value.key == "launch.engine"


def test_close_frees_in_the_documented_order_and_leaves_nothing():
    session = Session()
    log: list[tuple[str, int]] = []
    first = Recorded("first world", log, session, engine=MPI.name)
    second = Recorded("second world", log, session, engine=TORCH.name)
    session._remember(first, job=True)
    session._remember(second, job=True)
    older, newer = Recorded("older group", log, session), Recorded("newer group", log, session)
    for comm in (older, second, newer):  # the torch world tracks itself, as a TorchComm does
        session.track(comm)
    session.groups.register(newer, object())  # not a native group: nothing entered
    session.axes["DP"] = newer
    session.owns_process_group = False
    session.close(timeout=1.0)
    # axes first (0 bound while anything is freed), then the groups still open newest first,
    # then the worlds in the reverse of their opening; the world that tracks itself is freed once
    assert log == [("newer group", 0), ("older group", 0), ("second world", 0), ("first world", 0)]
    assert session.holdings() == {"worlds": 0, "open": 0, "groups": 0, "axes": 0, "process_group": 0}
    session.close()  # idempotent
    assert len(log) == 4


def test_a_rank_that_is_a_thread_has_its_own_world_and_axes(fresh_session):
    comms = ThreadWorld(3).comms()
    seen: dict[int, tuple[int, float, int]] = {}
    errors: list[BaseException] = []

    def rank_main(comm: Communicator) -> None:
        try:
            with bound_session(Session(world=comm)) as session:
                assert world_comm() is comm and current_session() is session
                total = float(ops.dist_sum(np.array([comm.rank + 1.0]))[0])  # group=None: this job's world
                ops.bind_axis("DP", comm)
                seen[comm.rank] = (world_comm().rank, total, ops.axis_group("DP").rank)
            assert current_session() is fresh_session and session.holdings()["axes"] == 0
        except BaseException as err:  # handed to the test's thread
            errors.append(err)

    threads = [threading.Thread(target=rank_main, args=(c,), daemon=True) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert seen == {0: (0, 6.0, 0), 1: (1, 6.0, 1), 2: (2, 6.0, 2)}
    assert fresh_session.holdings()["axes"] == 0  # no rank's binding reached the process's session


def test_two_local_engine_jobs_in_one_process_leave_nothing_behind(tmp_path, fresh_session):
    before_threads = {t.ident for t in threading.enumerate()}
    before = fresh_session.holdings()
    for n in range(2):
        out = tmp_path / f"job{n}"
        config = Config.from_yaml(str(TOY), overrides=["run.steps=5", f"run.out_dir={out}"])
        assert run_in_process(config, 4) == 0
        assert len(list(out.iterdir())) == 1  # it ran, to a run directory of its own
        assert fresh_session.holdings() == before
        assert current_session() is fresh_session
        left = [t.name for t in threading.enumerate() if t.ident not in before_threads and t.is_alive()]
        assert left == [], f"job {n} left threads behind: {left}"
        logs = [h for h in logging.getLogger("gflowdist").handlers if hasattr(h, "gflowdist_rank")]
        assert logs == [], f"job {n} left its ranks' log files open: {logs}"


CLOSE_A_TORCH_SESSION = r"""
import sys, threading
sys.stdout.reconfigure(line_buffering=True, write_through=False)
import torch.distributed as dist
from gflowdist.comm import world_comm, release_world_comm
from gflowdist.comm.session import current_session
import gflowdist.ops as ops

session = current_session()
world = world_comm("torch")  # initialises gloo from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
session.owns_process_group = True  # as torchgfn's initialize_distributed_compute marks the group it made
group = world.split([[0]])
group.send(b"to myself", 0, tag=3)  # its receiver threads run
ops.bind_axis("DP", group)
print("holding", sorted(session.holdings().items()))
release_world_comm()
print("after", sorted(session.holdings().items()))
print("initialized", dist.is_initialized())
print("threads", sorted(t.name for t in threading.enumerate() if t is not threading.main_thread()))
"""


def test_closing_a_torch_session_frees_the_groups_and_destroys_the_process_group(tmp_path):
    import os
    import subprocess
    import sys

    from gflowdist.jobenv import free_port, without_launcher

    env = dict(without_launcher(dict(os.environ)), RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    env["MASTER_PORT"] = str(free_port())
    script = tmp_path / "close_torch_session.py"
    script.write_text(CLOSE_A_TORCH_SESSION)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    holding = "holding [('axes', 1), ('groups', 2), ('open', 2), ('process_group', 1), ('worlds', 1)]"
    assert holding in lines, done.stdout
    assert "after [('axes', 0), ('groups', 0), ('open', 0), ('process_group', 0), ('worlds', 0)]" in lines
    assert "initialized False" in lines
    assert "threads []" in lines, done.stdout
