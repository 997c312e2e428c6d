"""Inserts/s and samples/s of gflowdist's replay buffers vs a naive Python-list buffer.

    python benchmarks/replay_local.py            # 1 s per cell, about a minute
    python benchmarks/replay_local.py --quick    # a smoke run, a few seconds

One process. Two item kinds:

- ``small``: HyperGrid-sized trajectories: states int64 [21, 2], actions
  int64 [20], log_reward float32 [] (~0.5 KB);
- ``large``: ~1 MiB per trajectory: observations float32 [512, 512] plus the
  same actions and log_reward.

Producers deliver batches (``insert batch`` items per extend); trainers draw
``sample batch`` items per call. Rates are items per second, measured in a
steady state (buffer already full, so every insert also evicts), best of 10
rounds per cell to damp interference from other processes. The naive
baseline keeps one dict of tensor *views* per item in a list (no copy on
insert, a ring index for overwrites), samples indices with ``random`` and
stacks rows per field. Ratios are relative to that baseline in the same run;
absolute numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import torch

from gflowdist.replay import ReplayBuffer
from gflowdist.timing.text_table import table_lines

# (item kind, capacity, insert batch, sample batch)
CASES = [
    ("small", 10_000, 16, 64),
    ("small", 10_000, 256, 256),
    ("large", 256, 4, 16),
]


def make_batch(kind: str, size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    batch = {
        "actions": torch.randint(0, 3, (size, 20), generator=generator),
        "log_reward": torch.randn(size, generator=generator),
        # random terminal keys so the dedup writer admits (almost) everything
        "terminal": torch.randint(0, 2**62, (size, 2), generator=generator),
    }
    if kind == "small":
        batch["states"] = torch.randint(0, 8, (size, 21, 2), generator=generator)
    else:
        batch["observations"] = torch.randn(size, 512, 512, generator=generator)
    return batch


class ListBuffer:
    """The naive baseline: a Python list of per-item dicts (views), overwritten as a ring."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.items: list[dict[str, torch.Tensor]] = []
        self.cursor = 0

    def extend(self, batch: dict[str, torch.Tensor]) -> None:
        size = next(iter(batch.values())).shape[0]
        for row in range(size):
            item = {name: value[row] for name, value in batch.items()}
            if len(self.items) < self.capacity:
                self.items.append(item)
            else:
                self.items[self.cursor] = item
            self.cursor = (self.cursor + 1) % self.capacity

    def sample(self, n: int) -> dict[str, torch.Tensor]:
        chosen = [self.items[random.randrange(len(self.items))] for _ in range(n)]
        return {name: torch.stack([item[name] for item in chosen]) for name in chosen[0]}


def rate(step: Callable[[], None], items_per_step: int, seconds: float, rounds: int = 10) -> float:
    """Items per second of repeated ``step()`` calls: the best of ``rounds`` rounds
    of ``seconds / rounds`` each (the least disturbed by other processes)."""
    for _ in range(3):  # warm up
        step()
    best = 0.0
    for _ in range(rounds):
        calls, start = 0, time.perf_counter()
        while True:
            step()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / rounds:
                break
        best = max(best, calls * items_per_step / elapsed)
    return best


def buffers(capacity: int) -> dict[str, Callable[[], object]]:
    return {
        "naive list": lambda: ListBuffer(capacity),
        "uniform": lambda: ReplayBuffer.uniform(capacity),
        "prioritized": lambda: ReplayBuffer.prioritized(capacity, 0.6, 0.4),
        "keep_highest": lambda: ReplayBuffer.keep_highest(capacity),
        "dedup": lambda: ReplayBuffer.dedup(capacity, "terminal"),
    }


def measure(kind: str, capacity: int, insert_batch: int, sample_batch: int, seconds: float) -> list[list[str]]:
    """One table row per buffer; ratios against the naive list in this same case."""
    generator = torch.Generator().manual_seed(0)
    pool = [make_batch(kind, insert_batch, generator) for _ in range(8)]
    rows = []
    for name, build in buffers(capacity).items():
        buffer = build()
        counter = iter(range(1 << 62))

        def insert() -> None:
            batch = pool[next(counter) % len(pool)]
            if isinstance(buffer, ListBuffer):
                buffer.extend(batch)
            else:
                batch = dict(batch, terminal=batch["terminal"] + next(counter))  # fresh keys
                buffer.extend(batch, producer=1, seq=0, policy_version=0, scores=batch["log_reward"])

        for _ in range(capacity // insert_batch + 1):  # fill: steady state evicts
            insert()
        inserts = rate(insert, insert_batch, seconds)
        samples = rate(lambda: buffer.sample(sample_batch), sample_batch, seconds)
        rows.append((name, inserts, samples))
    _, naive_inserts, naive_samples = rows[0]
    return [
        [
            kind,
            name,
            f"{insert_batch}/{sample_batch}",
            f"{inserts:,.0f}",
            f"{inserts / naive_inserts:.2f}x",
            f"{samples:,.0f}",
            f"{samples / naive_samples:.2f}x",
        ]
        for name, inserts, samples in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measured cell")
    parser.add_argument("--quick", action="store_true", help="0.1 s per cell, small items only")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (a buffer rank on a shared node uses 1)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    random.seed(0)
    torch.manual_seed(0)
    seconds = 0.1 if args.quick else args.seconds
    cases = CASES[:1] if args.quick else CASES
    table = [row for case in cases for row in measure(*case, seconds)]
    headers = ["items", "buffer", "batch in/out", "inserts/s", "vs naive", "samples/s", "vs naive"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {seconds:g} s per cell")
    print("\n".join(table_lines(headers, table, align="ll")))


if __name__ == "__main__":
    main()
