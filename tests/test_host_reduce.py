"""The shared-memory all-reduce of a crowded machine (gflowdist.comm.host_reduce), its ranks played by threads.

The ranked suite (tests/ranked/test_host_reduce.py) runs it between real MPI ranks.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gflowdist.comm.host_reduce import SHM_DIR, Doorbell, HostReduce, datagram_queue_length, fits_queue
from gflowdist.comm.machine import machine_key


def wait_on(done, doorbell):
    while not done():
        doorbell.pause()


@pytest.fixture
def group():
    """Open a group of ``size`` ranks of ``capacity`` bytes a slot; every member and the file go at the end."""
    made: list[HostReduce] = []
    files: list[Path] = []

    def open_group(size: int, capacity: int) -> list[HostReduce]:
        token = HostReduce.new_token()
        files.append(HostReduce.create_segment(token, size, capacity))
        members = [HostReduce(rank, size, token, capacity) for rank in range(size)]
        files[-1].unlink()  # as the group's first rank does once every member has mapped it
        made.extend(members)
        return members

    yield open_group
    for member in made:
        member.close()
    for path in files:
        path.unlink(missing_ok=True)


def run_ranks(members, work):
    """``work(member)`` on a thread per member; the exceptions they raised."""
    errors: list[BaseException] = []

    def body(member):
        try:
            work(member)
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return errors


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_every_rank_gets_the_reduction_in_rank_order_call_after_call(group, dtype, op):
    size, calls, n = 3, 40, 257
    members = group(size, HostReduce.capacity_for(n * np.dtype(dtype).itemsize))
    rng = np.random.default_rng(7)
    inputs = (rng.standard_normal((calls, size, n)) * 100).astype(dtype)
    reduce = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    expected = []
    for call in range(calls):
        acc = inputs[call, 0].copy()
        for rank in range(1, size):
            reduce(acc, inputs[call, rank], out=acc)
        expected.append(acc)
    results = {m.rank: [] for m in members}

    def work(member):
        pace = random.Random(member.rank)
        for call in range(calls):
            if pace.random() < 0.3:  # ranks arrive in every order, some a call ahead of the others
                threading.Event().wait(pace.random() * 0.002)
            flat = inputs[call, member.rank].copy()
            member.all_reduce(flat, op, wait_on)
            results[member.rank].append(flat)

    assert run_ranks(members, work) == []
    for rank in range(size):
        for call in range(calls):
            assert results[rank][call].tobytes() == expected[call].tobytes(), (rank, call)


def test_arrays_shorter_than_the_slot_and_of_another_length_each_call(group):
    members = group(2, 4096)
    lengths = [1, 1000, 7, 512]
    results = {0: [], 1: []}

    def work(member):
        for n in lengths:
            flat = np.full(n, member.rank + 1.0, dtype=np.float32)
            member.all_reduce(flat, "sum", wait_on)
            results[member.rank].append(flat)

    assert run_ranks(members, work) == []
    for rank in (0, 1):
        assert [r.tolist() for r in results[rank]] == [[3.0] * n for n in lengths]


def test_a_peer_whose_doorbell_is_gone_is_named_and_the_others_still_rung(group):
    members = group(3, 64)
    members[1].close()
    assert members[0].ring(0) == {1}
    assert members[2]._drain(0) is False  # one peer of two has arrived at call 0 (rank 1 never will)
    assert members[2]._arrived[0] == 1


def test_a_doorbell_wait_returns_when_the_datagram_lands_not_when_its_slice_ends(group):
    members = group(2, 64)
    doorbell = Doorbell(members[1]._socket, slice_s=3600.0)  # a missed ring would outlast the test's timeout
    threading.Timer(0.05, lambda: members[0].ring(0)).start()
    doorbell.pause()
    assert members[1]._drain(0)


def test_capacity_rounds_up_to_a_power_of_two_of_at_least_64_bytes():
    assert [HostReduce.capacity_for(n) for n in (0, 1, 64, 65, 4096, 4097)] == [64, 64, 64, 128, 4096, 8192]


def test_only_groups_whose_doorbells_fit_the_kernels_datagram_queue_use_it():
    queue = datagram_queue_length()
    assert fits_queue(1) is False  # a group of one has nobody to reduce with
    assert fits_queue(2) is SHM_DIR.is_dir()
    largest = queue // 2 + 1  # at most two calls' doorbells from each peer wait in a socket
    assert fits_queue(largest) is SHM_DIR.is_dir()
    assert fits_queue(largest + 1) is False


def test_a_process_in_another_network_namespace_has_another_machine_key():
    """Abstract sockets are per network namespace: ranks in two of them (the "hosts" of tests/test_multihost.py,
    one kernel) must not take each other for neighbours."""
    code = "from gflowdist.comm.machine import machine_key; print(machine_key())"
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    apart = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert int(here.stdout) == machine_key()
    assert int(apart.stdout) != machine_key()


def test_closing_while_a_view_of_the_mapping_is_alive_does_not_raise(group):
    """free() after an error in a call: that call's frame may still hold a view of the slots."""
    member = group(1, 64)[0]
    view = member._memory[:8]
    member.close()
    member.close()
    assert view.size == 8  # the mapping lives as long as the view


def test_the_segment_is_reserved_when_made_so_a_full_tmpfs_refuses_it_then_not_mid_call():
    """Pages of a tmpfs file that was only truncated are allocated on first touch: where the tmpfs is too small
    (a container's 64 MiB /dev/shm) that touch is a SIGBUS. Made with the space reserved, it fails at once."""
    token = HostReduce.new_token()
    path = HostReduce.create_segment(token, 3, 1 << 20)
    try:
        assert path.stat().st_size == 2 * 3 * (1 << 20)
        assert path.stat().st_blocks * 512 >= 2 * 3 * (1 << 20)  # allocated, not a sparse file
    finally:
        path.unlink()


def test_a_tmpfs_too_small_for_the_segment_refuses_it_and_keeps_no_file():
    """A 1 MiB /dev/shm in a mount namespace of the child's own (the machine's /dev/shm is not touched)."""
    code = (
        "import errno, os\n"
        "from gflowdist.comm.host_reduce import HostReduce\n"
        "try:\n"
        "    HostReduce.create_segment(HostReduce.new_token(), 3, 1 << 20)\n"
        "    print('made')\n"
        "except OSError as exc:\n"
        "    print('refused', errno.errorcode.get(exc.errno))\n"
        "print('left', sorted(n for n in os.listdir('/dev/shm') if n.startswith('gflowdist-reduce')))\n"
    )
    shell = f'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} -c "$0"'
    out = subprocess.run(["unshare", "-m", "sh", "-c", shell, code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["refused ENOSPC", "left []"], out.stdout + out.stderr
