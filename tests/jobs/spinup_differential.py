"""Spinning Up's MPI helpers and gflowdist.compat.spinup, side by side on the same ranks.

Run as ``mpiexec -n N python tests/jobs/spinup_differential.py`` (see
tests/test_compat_originals.py). Every rank feeds both the same rank-dependent
inputs and checks the results are the same bits and the same types; it
prints ``SAME <check>`` for each and ``SPINUP DIFFERENTIAL OK <n>`` at the end,
or raises naming the check. Then a seeded PPO-style loop runs three times:
through the compat module, through a direct mpi4py implementation of the
original's arithmetic (written below), and through the original itself; the
final weights must be the same bits (``PPO SAME <n> <digest>``).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import sys
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "originals"))

from spinup.utils import mpi_pytorch as orig_pt
from spinup.utils import mpi_tools as orig

from gflowdist.compat import spinup as compat

# one write per line: mpiexec never glues two ranks' lines (PYTHONUNBUFFERED writes the newline apart)
sys.stdout.reconfigure(line_buffering=True, write_through=False)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def same_bits(a, b, what: str) -> None:
    """Same type, dtype, shape and bytes (NaN-safe), recursively through tuples."""
    if isinstance(a, tuple):
        if not isinstance(b, tuple) or len(a) != len(b):
            raise AssertionError(f"{what}: original {a!r} vs compat {b!r}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same_bits(x, y, f"{what}[{i}]")
        return
    if type(a) is not type(b):
        raise AssertionError(f"{what}: original type {type(a).__name__} ({a!r}), compat {type(b).__name__} ({b!r})")
    if isinstance(a, torch.Tensor):
        a, b = a.detach().numpy(), b.detach().numpy()
    if isinstance(a, (np.ndarray, np.generic)):
        if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
            raise AssertionError(f"{what}: original {a!r} ({a.dtype}) vs compat {b!r} ({b.dtype}) on rank {RANK}")
    elif a != b:
        raise AssertionError(f"{what}: original {a!r} vs compat {b!r} on rank {RANK}")


def check(what: str, run_original, run_compat) -> None:
    same_bits(run_original(), run_compat(), what)
    print(f"SAME {what}", flush=True)


def rank_data(n: int, scale: float = 1.0, offset: float = 0.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + RANK)
    return (offset + scale * rng.standard_normal(n)).astype(np.float32)


def helpers() -> None:
    check("proc_id", orig.proc_id, compat.proc_id)
    check("num_procs", orig.num_procs, compat.num_procs)
    # mpi_op / mpi_sum / mpi_avg on every kind of input the original takes
    inputs = {
        "python float": 0.1 * (RANK + 1) + 1e-3,
        "python int": RANK + 7,
        "numpy float32 scalar": np.float32(1 / 3 + RANK),
        "numpy float64 scalar": np.float64(2 / 3 + RANK),
        "list": [0.1 * RANK, 1 / 7, RANK**0.5],
        "float32 array": rank_data(257, seed=1),
        "float64 array": rank_data(33, seed=2).astype(np.float64) / 3,
        "2-d array": rank_data(12, seed=3).reshape(3, 4),
        "0-d array": np.array(1 / 3 + RANK, dtype=np.float64),
        "cpu tensor": torch.from_numpy(rank_data(9, seed=4)),
        "0-d tensor": torch.tensor(RANK + 1 / 9),
    }
    for name, x in inputs.items():
        check(f"mpi_sum({name})", lambda x=x: orig.mpi_sum(x), lambda x=x: compat.mpi_sum(x))
        check(f"mpi_avg({name})", lambda x=x: orig.mpi_avg(x), lambda x=x: compat.mpi_avg(x))
        for op, name_op in ((MPI.MAX, "MAX"), (MPI.MIN, "MIN")):
            check(
                f"mpi_op({name}, {name_op})",
                lambda x=x, op=op: orig.mpi_op(x, op),
                lambda x=x, op=op: compat.mpi_op(x, op),
            )

    # mpi_statistics_scalar: uneven lengths, an empty rank, a large mean next to a small spread
    samples = {
        "float32, uneven lengths": rank_data(100 + 37 * RANK, scale=3.0, offset=1.0, seed=5),
        "large mean": rank_data(64 + RANK, scale=1e-2, offset=1e4, seed=6),
        "float64 input": rank_data(50, seed=7).astype(np.float64) * np.pi,
        "list": [float(v) for v in rank_data(5 + RANK, seed=8)],
        "tensor": torch.from_numpy(rank_data(40, seed=9)),
        "empty on rank 1": rank_data(0 if RANK == 1 else 20, seed=10),
    }
    for name, x in samples.items():
        for mm in (False, True):
            check(
                f"mpi_statistics_scalar({name}, with_min_and_max={mm})",
                lambda x=x, mm=mm: orig.mpi_statistics_scalar(x, mm),
                lambda x=x, mm=mm: compat.mpi_statistics_scalar(x, mm),
            )

    def reduce_with(module, op=None):
        send = rank_data(17, seed=11)
        recv = np.zeros_like(send)
        if op is None:
            module.allreduce(send, recv)
        else:
            module.allreduce(send, recv, op=op)
        return recv

    check("allreduce(send, recv)", lambda: reduce_with(orig), lambda: reduce_with(compat))
    check("allreduce(op=MPI.MAX)", lambda: reduce_with(orig, MPI.MAX), lambda: reduce_with(compat, MPI.MAX))

    def broadcast_with(module):
        x = rank_data(6, seed=12)
        module.broadcast(x, root=SIZE - 1)
        return x

    check("broadcast(root=last)", lambda: broadcast_with(orig), lambda: broadcast_with(compat))

    def printed(module):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            module.msg([1, 2], "note")
        return out.getvalue()

    check("msg", lambda: printed(orig), lambda: printed(compat))

    def threads_after(setup):
        torch.set_num_threads(4)
        setup()
        return torch.get_num_threads()

    check(
        "setup_pytorch_for_mpi",
        lambda: threads_after(orig_pt.setup_pytorch_for_mpi),
        lambda: threads_after(compat.setup_pytorch_for_mpi),
    )
    torch.set_num_threads(1)

    def grads_through(avg_grads):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(5, 300), torch.nn.Tanh(), torch.nn.Linear(300, 3))
        torch.manual_seed(100 + RANK)
        model(torch.randn(8, 5)).pow(2).mean().backward()
        held = [p.grad for p in model.parameters()]
        avg_grads(model)
        if any(h is not p.grad for h, p in zip(held, model.parameters(), strict=True)):
            raise AssertionError("mpi_avg_grads replaced a gradient tensor instead of writing into it")
        return tuple(p.grad.clone() for p in model.parameters())

    check("mpi_avg_grads", lambda: grads_through(orig_pt.mpi_avg_grads), lambda: grads_through(compat.mpi_avg_grads))

    def synced_through(sync):
        torch.manual_seed(200 + RANK)
        model = torch.nn.Linear(4, 3)
        sync(model)
        return tuple(p.detach().clone() for p in model.parameters())

    check("sync_params", lambda: synced_through(orig_pt.sync_params), lambda: synced_through(compat.sync_params))


# -- a seeded PPO-style loop --------------------------------------------------------------------


class Direct:
    """The original's arithmetic, written directly on mpi4py (not through either module)."""

    @staticmethod
    def statistics(x):
        x = np.array(x, dtype=np.float32)
        totals = np.zeros(2, dtype=np.float32)
        WORLD.Allreduce(np.array([np.sum(x), len(x)], dtype=np.float32), totals, op=MPI.SUM)
        mean = totals[0] / totals[1]
        sq = np.zeros(1, dtype=np.float32)
        WORLD.Allreduce(np.array([np.sum((x - mean) ** 2)], dtype=np.float32), sq, op=MPI.SUM)
        return mean, np.sqrt(sq[0] / totals[1])

    @staticmethod
    def avg(value):
        out = np.zeros(1, dtype=np.float32)
        WORLD.Allreduce(np.array([value], dtype=np.float32), out, op=MPI.SUM)
        return out[0] / SIZE

    @staticmethod
    def avg_grads(module):
        if SIZE == 1:
            return
        for p in module.parameters():
            grad = p.grad.numpy()
            total = np.zeros_like(grad, dtype=np.float32)
            WORLD.Allreduce(np.asarray(grad, dtype=np.float32), total, op=MPI.SUM)
            grad[:] = total / SIZE

    @staticmethod
    def sync(module):
        for p in module.parameters():
            WORLD.Bcast(p.data.numpy(), root=0)


class Compat:
    statistics = staticmethod(lambda x: compat.mpi_statistics_scalar(x))
    avg = staticmethod(compat.mpi_avg)
    avg_grads = staticmethod(compat.mpi_avg_grads)
    sync = staticmethod(compat.sync_params)


class Original:
    statistics = staticmethod(orig.mpi_statistics_scalar)
    avg = staticmethod(orig.mpi_avg)
    avg_grads = staticmethod(orig_pt.mpi_avg_grads)
    sync = staticmethod(orig_pt.sync_params)


class CompatPrecise(Compat):
    statistics = staticmethod(lambda x: compat.mpi_statistics_scalar(x, precise=True))


def ppo(impl, epochs: int = 12, steps: int = 96, train_iters: int = 20, target_kl: float = 0.01) -> tuple[str, int]:
    """Weights' digest after a small PPO on a synthetic bandit, and how often the KL stop fired."""
    torch.manual_seed(0 + 10000 * RANK)  # Spinning Up seeds each rank differently
    pi = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    vf = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    impl.sync(pi)
    impl.sync(vf)
    pi_opt = torch.optim.Adam(pi.parameters(), lr=3e-3)
    vf_opt = torch.optim.Adam(vf.parameters(), lr=1e-2)
    stops = 0
    for _ in range(epochs):
        obs = torch.randn(steps, 4)
        with torch.no_grad():
            dist = torch.distributions.Categorical(logits=pi(obs))
            act = dist.sample()
            logp_old = dist.log_prob(act)
            ret = (obs[:, 0] * (act == 0) + obs[:, 1] * (act == 1) - 0.3 * (act == 2) + 0.1 * torch.randn(steps)) * 7
            adv = (ret - vf(obs).squeeze(-1)).numpy()
        mean, std = impl.statistics(adv)
        adv = torch.as_tensor((adv - mean) / std, dtype=torch.float32)
        for _ in range(train_iters):
            pi_opt.zero_grad()
            logp = torch.distributions.Categorical(logits=pi(obs)).log_prob(act)
            ratio = torch.exp(logp - logp_old)
            loss = -(torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)).mean()
            kl = impl.avg((logp_old - logp).mean().item())
            if kl > 1.5 * target_kl:
                stops += 1
                break
            loss.backward()
            impl.avg_grads(pi)
            pi_opt.step()
        for _ in range(5):
            vf_opt.zero_grad()
            ((vf(obs).squeeze(-1) - ret) ** 2).mean().backward()
            impl.avg_grads(vf)
            vf_opt.step()
    digest = hashlib.sha256()
    for p in [*pi.parameters(), *vf.parameters()]:
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()[:16], stops


def main() -> None:
    torch.set_num_threads(1)
    helpers()
    print(f"SPINUP DIFFERENTIAL OK {SIZE}", flush=True)
    runs = {name: ppo(impl) for name, impl in (("direct", Direct), ("compat", Compat), ("original", Original))}
    if len({digest for digest, _ in runs.values()}) != 1:
        raise AssertionError(f"PPO weights differ on rank {RANK}: {runs}")
    digests = WORLD.allgather(runs["compat"][0])
    if len(set(digests)) != 1:
        raise AssertionError(f"PPO weights differ between ranks: {digests}")
    precise = ppo(CompatPrecise)
    print(f"PPO SAME {SIZE} {runs['compat'][0]} kl_stops={runs['compat'][1]} precise={precise[0]}", flush=True)


if __name__ == "__main__":
    main()
