"""A user's gloo script: compat collectives on the world and on a group it built, then its own
``dist.destroy_process_group()`` (torch's usual last line), before gflowdist frees anything.

The wrappers gflowdist made of those groups must not hold the process alive (a receiver thread
blocked in gloo on a destroyed group) nor keep the last reference to a destroyed group until the
interpreter's end (its destructor then aborts the process).
"""

import torch
import torch.distributed as dist

from gflowdist.compat import omnisafe, torchgfn

dist.init_process_group("gloo", init_method="env://")
rank, size = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank)])
omnisafe.avg_tensor(value)
assert abs(float(value) - (size - 1) / 2) < 1e-6, float(value)
members = list(range(1, size))
group = dist.new_group(members)  # collective: every rank makes it
if rank in members:
    x = torch.tensor([float(rank)])
    torchgfn.broadcast(x, 0, "torch", group=group)  # src: the group's first member, world rank 1
    assert float(x) == 1.0, float(x)
# rank 0 serves the TCPStore: leaving before the others have read their last keys (new_group reads
# them after its own barrier) ends their runs with "connection closed", as it would a user's script
dist.barrier()
dist.destroy_process_group()
print("EXITING", rank, flush=True)
