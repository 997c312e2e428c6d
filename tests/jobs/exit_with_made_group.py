"""A gloo job that ends without ``destroy_process_group()``: who destroys the default group at exit.

``python exit_with_made_group.py MODE`` on torch env:// ranks, MODE one of

- ``made``: gflowdist initialises the group (``ensure_process_group``, as
  OmniSafe's ``fork`` does in a worker); the exit destroys it;
- ``user``: the script initialises it itself; the exit leaves it to the script;
- ``raise``: gflowdist made it, but rank 0 dies of an uncaught exception
  (a collective may be pending): the exit leaves it. Rank 1 ends normally
  (the test launcher kills the others once a rank fails, so only the rank
  that fails is sure to reach its end).

A handler registered before gflowdist is imported runs after gflowdist's exit
hook: it prints whether the group was still there, then destroys what is left.
"""

import atexit
import sys

import torch
import torch.distributed as dist


def report() -> None:
    there = dist.is_initialized()
    print(f"AT EXIT {dist.get_rank() if there else '-'} GROUP {'KEPT' if there else 'DESTROYED'}", flush=True)
    if there:
        dist.destroy_process_group()


atexit.register(report)

from gflowdist.launch import ensure_process_group  # noqa: E402 (after the handler: see the docstring)

mode = sys.argv[1]
if mode == "user":
    dist.init_process_group("gloo")
ensure_process_group("cpu")
x = torch.ones(1)
dist.all_reduce(x)
print(f"RANK {dist.get_rank()} SUM {int(x.item())}", flush=True)
if mode == "raise" and dist.get_rank() == 0:
    raise RuntimeError("the script failed")
