"""Mutation fuzzer for the wire codec: decode must return a Message or raise ProtocolError, nothing else.

Run:  .venv/bin/python benchmarks/fuzz_codec.py [--cases 100000] [--seed 0]

Starts from a corpus of valid encodings (tiny bodies, nested containers, numpy
arrays and torch tensors of every wire dtype, 0-d, empty and many-frame
messages) and applies one to three seeded mutations per case:

    flip       overwrite 1-8 random bytes with random values
    bitflip    flip one bit
    header     overwrite 1-4 bytes inside the prefix + msgpack header
    truncate   cut the message at a random length
    insert     insert 1-64 random bytes at a random place
    delete     remove a random range
    duplicate  copy a random slice and insert it at a random place
    splice     head of this message + tail of another valid one

Half of the mutated messages then get their declared total length (bytes
8..16) rewritten to the new size, so the checks behind the length check are
exercised too. Prints a count per outcome (ok / ProtocolError / failure: any
other exception) and per mutation, the most common refusal reasons, the first
failures, and exits 1 if there was any failure.
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from gflowdist.errors import ProtocolError
from gflowdist.transport import SUPPORTED_DTYPES, MessageType, decode, encode

SENDER = 3
_TOTAL = struct.Struct("<Q")


def corpus() -> list[bytes]:
    """Valid encodings covering every header and frame feature."""
    bodies: list[Any] = [
        None,
        {"step": 3, "ok": True},
        {"s": "héllo", "b": b"\x00\x01", "f": -1.5, "big": 2**64 - 1, "neg": -(2**63), "nested": [[1, [2, {"x": []}]]]},
        [1, 2.5, "three", None, False, {"k": b"v"}],
        {
            "states": np.arange(2 * 5 * 4, dtype=np.int64).reshape(2, 5, 4),
            "actions": np.arange(10).reshape(2, 5),
            "log_rewards": np.linspace(-1, 0, 2, dtype=np.float32),
            "done": np.eye(2, 5, dtype=bool),
        },
        {"w": torch.arange(6.0).reshape(2, 3), "bf": torch.ones(3, dtype=torch.bfloat16), "scalar": torch.tensor(7)},
        {"zero_d": np.array(2.5), "empty": np.zeros((0, 3), np.int16), "after": np.ones(5, np.int8)},
        {"frames": [np.full(i + 1, i, dtype=np.uint8) for i in range(6)]},
    ]
    bodies.append(
        {
            name: (torch.ones(2, dtype=torch.bfloat16) if name == "bfloat16" else np.ones(3, dtype=name))
            for name in SUPPORTED_DTYPES
        }
    )
    types = list(MessageType)
    return [encode(types[i % len(types)], body, sender=SENDER, seq=i).tobytes() for i, body in enumerate(bodies)]


def _flip(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return data


def _bitflip(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return data


def _header(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    header_end = 16 + struct.unpack_from("<I", data, 4)[0] if len(data) >= 16 else len(data)
    limit = max(1, min(len(data), header_end))
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(limit)] = rng.choice((0, 0xFF, 0x7F, 0x80, 0xC1, 0xDD, 0xDF, rng.randrange(256)))
    return data


def _truncate(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    return data[: rng.randrange(len(data) + 1)]


def _insert(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    at = rng.randrange(len(data) + 1)
    return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[at:]


def _delete(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    start = rng.randrange(len(data) + 1)
    return data[:start] + data[start + rng.randint(1, 64) :]


def _duplicate(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    start = rng.randrange(len(data) + 1)
    piece = data[start : start + rng.randint(1, 64)]
    at = rng.randrange(len(data) + 1)
    return data[:at] + piece + data[at:]


def _splice(rng: random.Random, data: bytearray, corpus_: list[bytes]) -> bytearray:
    other = rng.choice(corpus_)
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]


MUTATIONS: dict[str, Callable[[random.Random, bytearray, list[bytes]], bytearray]] = {
    "flip": _flip,
    "bitflip": _bitflip,
    "header": _header,
    "truncate": _truncate,
    "insert": _insert,
    "delete": _delete,
    "duplicate": _duplicate,
    "splice": _splice,
}


def _touch(value: Any) -> None:
    """Read every byte a decoded value claims to have (a bad view would crash or raise here)."""
    if isinstance(value, dict):
        for item in value.values():
            _touch(item)
    elif isinstance(value, list):
        for item in value:
            _touch(item)
    elif isinstance(value, np.ndarray):
        value.tobytes()
    elif isinstance(value, torch.Tensor):
        (value.view(torch.int16) if value.dtype == torch.bfloat16 else value).numpy().tobytes()


def _reason(error: ProtocolError) -> str:
    """The refusal reason with numbers and quoted values blanked, to count kinds of refusal."""
    text = str(error).split(": ", 1)[-1]
    text = re.sub(r"b?'[^']*'|\[[^\]]*\]", "…", text)
    return re.sub(r"-?\d+", "N", text)[:72]


def run(cases: int, seed: int) -> tuple[collections.Counter, collections.Counter, collections.Counter, list[str]]:
    """Fuzz ``cases`` mutated messages.

    Returns (outcomes, (first mutation, outcome) counts, ProtocolError reasons, first failures).
    """
    rng = random.Random(seed)
    seeds = corpus()
    outcomes: collections.Counter = collections.Counter()
    per_mutation: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    failures: list[str] = []
    names = list(MUTATIONS)
    for _ in range(cases):
        data = bytearray(rng.choice(seeds))
        applied = [rng.choice(names) for _ in range(rng.randint(1, 3))]
        for name in applied:
            data = MUTATIONS[name](rng, data, seeds)
        if len(data) >= 16 and rng.random() < 0.5:
            _TOTAL.pack_into(data, 8, len(data))
        try:
            _touch(decode(data, sender=SENDER).body)
            outcome = "ok"
        except ProtocolError as error:
            outcome = "ProtocolError"
            reasons[_reason(error)] += 1
        except Exception as exc:
            outcome = "failure"
            if len(failures) < 5:
                failures.append(f"{type(exc).__name__}: {exc} after {'+'.join(applied)} on {bytes(data).hex()}")
        outcomes[outcome] += 1
        per_mutation[(applied[0], outcome)] += 1
    return outcomes, per_mutation, reasons, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=100_000, help="number of mutated messages (default 100000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--reasons", type=int, default=12, help="how many refusal reasons to list (default 12)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    outcomes, per_mutation, reasons, failures = run(args.cases, args.seed)
    elapsed = time.perf_counter() - started
    print(f"fuzzed {args.cases} mutated messages (seed {args.seed}) in {elapsed:.1f} s")
    print(f"{'outcome':<16}{'count':>10}")
    for outcome in ("ok", "ProtocolError", "failure"):
        print(f"{outcome:<16}{outcomes[outcome]:>10}")
    print(f"\n{'first mutation':<16}{'ok':>10}{'ProtocolError':>15}{'failure':>10}")
    for name in MUTATIONS:
        print(
            f"{name:<16}"
            + "".join(
                f"{per_mutation[(name, o)]:>{w}}" for o, w in (("ok", 10), ("ProtocolError", 15), ("failure", 10))
            )
        )
    print(f"\n{len(reasons)} kinds of ProtocolError; the most common:")
    for reason, count in reasons.most_common(args.reasons):
        print(f"{count:>10}  {reason}")
    for failure in failures:
        print("FAILURE", failure)
    return 1 if outcomes["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
