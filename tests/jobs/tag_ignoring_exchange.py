"""compat send/recv on several tags over a transport that ignores tags, then a plain exit.

Run as 3 gloo processes (torch's env:// variables; see tests/test_torch_comm_exit.py).
With ``IGNORE_TAGS=1`` the world communicator's point-to-point group is
wrapped so that every send and receive goes out on tag 0, as nccl's
point-to-point does: the framing must not depend on tags. Every rank sends
every other rank small (inline) and large (in pieces) messages on three tags,
receives them in another tag order, prints ``EXCHANGED <rank>`` and returns
without freeing anything: the process must still exit with status 0.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from gflowdist.comm import world_comm
from gflowdist.compat import torchgfn as tg


class TagIgnoringGroup:
    """A process group whose point-to-point operations all use tag 0."""

    def __init__(self, group):
        self._group = group

    def send(self, tensors, dst, tag):
        return self._group.send(tensors, dst, 0)

    def recv(self, tensors, src, tag):
        return self._group.recv(tensors, src, 0)

    def __getattr__(self, name):
        return getattr(self._group, name)


def main() -> None:
    dist.init_process_group("gloo")
    world = world_comm("torch")
    if os.environ.get("IGNORE_TAGS") == "1":
        world._pg = TagIgnoringGroup(world._pg)  # before the first point-to-point call starts the lanes
    rank, size = world.rank, world.size
    sizes = (10, 70_000, 1_500_000)  # inline, two pieces, several pieces
    tags = (0, 3, 7)
    for tag in tags:
        for dst in range(size):
            if dst != rank:
                for n in sizes:
                    tg.send(
                        {"from": rank, "tag": tag, "x": torch.full((n,), rank * 100 + tag, dtype=torch.uint8)},
                        dst,
                        "torch",
                        tag,
                    )
    for tag in reversed(tags):
        for src in range(size):
            if src != rank:
                for n in sizes:
                    source, msg = tg.recv(src, backend="torch", tag=tag, timeout=60)
                    assert source == src and msg["from"] == src and msg["tag"] == tag, (source, msg["from"], msg["tag"])
                    x = msg["x"]
                    assert x.numel() == n and bool((x == src * 100 + tag).all()), f"payload from {src} on tag {tag}"
    print(f"EXCHANGED {rank}", flush=True)


if __name__ == "__main__":
    main()
