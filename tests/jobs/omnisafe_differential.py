"""OmniSafe 0.5.0's ``utils/distributed.py`` and gflowdist.compat.omnisafe, side by side on gloo ranks.

Run as N processes with torch's env:// variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as torchrun would start them:
``python tests/jobs/omnisafe_differential.py <path of the original file>``
(see tests/test_compat_originals.py). The original is loaded as a file of its
own. Every rank feeds both the same rank-dependent inputs and checks the same
bits; it prints ``SAME <check>`` for each, ``DOCUMENTED <check>`` where
docs/migration.md names the difference (and checks it is exactly that one),
and ``OMNISAFE DIFFERENTIAL OK <n>`` at the end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys

import numpy as np
import torch

from gflowdist.compat import omnisafe as compat

# one write per line: mpiexec never glues two ranks' lines (PYTHONUNBUFFERED writes the newline apart)
sys.stdout.reconfigure(line_buffering=True, write_through=False)


def load_original(path: str):
    spec = importlib.util.spec_from_file_location("omnisafe_distributed_original", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


orig = load_original(sys.argv[1])
orig.fork(1)  # inside the job (MASTER_ADDR set): the original initialises the gloo group
compat.fork(1)  # and gflowdist finds it
RANK, SIZE = orig.get_rank(), orig.world_size()


def same_bits(a, b, what: str) -> None:
    if isinstance(a, tuple):
        if not isinstance(b, tuple) or len(a) != len(b):
            raise AssertionError(f"{what}: original {a!r} vs compat {b!r}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_bits(x, y, f"{what}[{i}]")
        return
    if type(a) is not type(b):
        raise AssertionError(f"{what}: original type {type(a).__name__} ({a!r}), compat {type(b).__name__} ({b!r})")
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.numpy().tobytes() != b.numpy().tobytes():
            raise AssertionError(f"{what}: original {a!r} vs compat {b!r} on rank {RANK}")
    elif a != b:
        raise AssertionError(f"{what}: original {a!r} vs compat {b!r} on rank {RANK}")


def check(what: str, run_original, run_compat) -> None:
    same_bits(run_original(), run_compat(), what)
    print(f"SAME {what}", flush=True)


def rank_data(n: int, scale: float = 1.0, offset: float = 0.0, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(1000 * seed + RANK)
    return torch.from_numpy((offset + scale * rng.standard_normal(n)).astype(np.float32))


def reductions() -> None:
    check("get_rank", orig.get_rank, compat.get_rank)
    check("world_size", orig.world_size, compat.world_size)
    inputs = {
        "python float": 0.1 * (RANK + 1) + 1e-3,
        "python int": RANK + 7,
        "list": [0.1 * RANK, 1 / 7, RANK**0.5],
        "float64 array": rank_data(33, seed=2).numpy().astype(np.float64) / 3,
        "float32 tensor": rank_data(257, seed=1),
        "float64 tensor": rank_data(19, seed=3).double() / 7,
        "0-d tensor": torch.tensor(RANK + 1 / 9),
    }
    # the original reduces a float32 tensor in place (documented): each side gets its own copy
    copy = lambda x: x.clone() if isinstance(x, torch.Tensor) else x  # noqa: E731
    for name, x in inputs.items():
        for fn in ("dist_sum", "dist_avg", "dist_max", "dist_min"):
            check(
                f"{fn}({name})",
                lambda x=x, fn=fn: getattr(orig, fn)(copy(x)),
                lambda x=x, fn=fn: getattr(compat, fn)(copy(x)),
            )

    def averaged(avg_tensor):
        x = rank_data(40, seed=4)
        avg_tensor(x)
        return x

    check("avg_tensor", lambda: averaged(orig.avg_tensor), lambda: averaged(compat.avg_tensor))


def statistics() -> None:
    samples = {
        "equal lengths": rank_data(100, scale=3.0, offset=1.0, seed=5),
        "uneven lengths": rank_data(60 + 17 * RANK, seed=6),
        "large mean": rank_data(64, scale=1e-2, offset=1e4, seed=7),
        "float64 tensor": rank_data(50, seed=8).double() * np.pi,
    }
    for name, x in samples.items():
        check(
            f"dist_statistics_scalar({name})",
            lambda x=x: orig.dist_statistics_scalar(x.clone()),
            lambda x=x: compat.dist_statistics_scalar(x.clone()),
        )
    # with_min_and_max: the original reduces element-wise (equal lengths only), returns vectors, and
    # its MIN overwrites the float32 input in place, so its max is the max of the minima (documented).
    # gflowdist returns the scalar extremes: the extremes of the original's element-wise reductions
    # of untouched inputs.
    x = samples["equal lengths"]
    o_mean, o_std, o_min, _ = orig.dist_statistics_scalar(x.clone(), with_min_and_max=True)
    c_mean, c_std, c_min, c_max = compat.dist_statistics_scalar(x.clone(), with_min_and_max=True)
    same_bits((o_mean, o_std), (c_mean, c_std), "dist_statistics_scalar(with_min_and_max) mean, std")
    same_bits((o_min.min(), orig.dist_max(x.clone()).max()), (c_min, c_max), "dist_statistics_scalar min, max")
    print("DOCUMENTED dist_statistics_scalar(with_min_and_max): scalar extremes", flush=True)


def modules() -> None:
    def model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(5, 300), torch.nn.Tanh(), torch.nn.Linear(300, 3))

    def grads_through(avg_grads):
        net = model(3)
        torch.manual_seed(100 + RANK)
        net(torch.randn(8, 5)).pow(2).mean().backward()
        avg_grads(net)
        return tuple(p.grad.clone() for p in net.parameters())

    def params_through(op):
        net = model(200 + RANK)
        op(net)
        return tuple(p.detach().clone() for p in net.parameters())

    check("avg_grads", lambda: grads_through(orig.avg_grads), lambda: grads_through(compat.avg_grads))
    check("avg_params", lambda: params_through(orig.avg_params), lambda: params_through(compat.avg_params))
    check("sync_params", lambda: params_through(orig.sync_params), lambda: params_through(compat.sync_params))

    def printed(setup):
        torch.set_num_threads(4)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            setup()
        return out.getvalue(), torch.get_num_threads()

    check("setup_distributed", lambda: printed(orig.setup_distributed), lambda: printed(compat.setup_distributed))
    torch.set_num_threads(1)


def aliases() -> None:
    """0.5's torch.distributed re-exports, called as OmniSafe code calls them."""

    def reduced(module):
        x = rank_data(10, seed=9)
        module.all_reduce(x)
        return x

    check("all_reduce", lambda: reduced(orig), lambda: reduced(compat))

    def gathered(module):
        out = [torch.zeros(4) for _ in range(SIZE)]
        module.all_gather(out, rank_data(4, seed=10))
        return tuple(out)

    check("all_gather", lambda: gathered(orig), lambda: gathered(compat))

    def broadcasted(module):
        x = rank_data(5, seed=11)
        module.broadcast(x, src=SIZE - 1)
        return x

    check("broadcast", lambda: broadcasted(orig), lambda: broadcasted(compat))


if __name__ == "__main__":
    torch.set_num_threads(1)
    reductions()
    statistics()
    modules()
    aliases()
    print(f"OMNISAFE DIFFERENTIAL OK {SIZE}", flush=True)
    # torch's rule (OmniSafe's scripts skip it): destroy the process group before exit, or a gloo worker
    # may drop its last finished work while the interpreter shuts down and abort the rank
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
