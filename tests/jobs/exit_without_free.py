"""A gloo rank that trades 300 messages with its peer and exits without freeing anything.

Left to themselves, its send-completion thread is still dropping finished
sends (and its receiver may see the peer's socket close) while the
interpreter shuts down, which aborts the process. The exit hook of
gflowdist.comm.torch_dist frees the communicator first.
"""

from gflowdist.comm import world_comm

world = world_comm("torch")
peer = 1 - world.rank
for _ in range(300):
    world.isend(b"x" * 1000, peer, tag=1)
    world.recv(peer, tag=1, timeout=30)
print("EXITING", world.rank, flush=True)
