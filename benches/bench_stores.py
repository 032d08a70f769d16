"""Store throughput through Python: ferrodist vs torch, HashStore and FileStore, in one run.

Each figure is single-thread operations per second for one op kind (set, get, add, check) on
keys that already exist, the best of several rounds (the machine may be shared); the ratio is
ferrodist / torch, so above 1.0x means ferrodist does more operations per second.

    ./scripts/bench benches/bench_stores.py [--seconds 0.3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch.distributed as tdist

import ferrodist

KEYS = [f"key{i}" for i in range(64)]


def _ops(store: tdist.Store) -> dict[str, Callable[[int], None]]:
    """Each op as a loop of n calls, cycling over existing keys."""
    keys = KEYS
    nkeys = len(keys)
    for k in keys:
        store.set(k, "1")

    def sets(n: int) -> None:
        for i in range(n):
            store.set(keys[i % nkeys], "value")

    def gets(n: int) -> None:
        for i in range(n):
            store.get(keys[i % nkeys])

    def adds(n: int) -> None:
        for _ in range(n):
            store.add("counter", 1)

    def checks(n: int) -> None:
        for i in range(n):
            store.check([keys[i % nkeys]])

    return {"set": sets, "get": gets, "add": adds, "check": checks}


def _rate(loop: Callable[[int], None], seconds: float) -> float:
    """Operations per second of `loop`, sized to run about `seconds`."""
    n = 64
    while True:
        start = time.perf_counter()
        loop(n)
        took = time.perf_counter() - start
        if took >= seconds:
            return n / took
        n = max(n * 2, int(n * seconds / max(took, 1e-6)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=0.3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp())
    pairs = {
        "HashStore": (tdist.HashStore(), ferrodist.HashStore()),
        "FileStore": (
            tdist.FileStore(str(tmp / "torch"), -1),
            ferrodist.FileStore(str(tmp / "ours"), -1),
        ),
    }
    rows = []
    for store_name, (theirs, ours) in pairs.items():
        their_ops, our_ops = _ops(theirs), _ops(ours)
        for op in their_ops:
            best_theirs = best_ours = 0.0
            for _ in range(args.rounds):  # interleaved, so load changes hit both sides
                best_theirs = max(best_theirs, _rate(their_ops[op], args.seconds))
                best_ours = max(best_ours, _rate(our_ops[op], args.seconds))
            rows.append((store_name, op, best_theirs, best_ours))

    print("| store | op | torch ops/s | ferrodist ops/s | ratio |")
    print("|---|---|---:|---:|---:|")
    for store_name, op, theirs_rate, ours_rate in rows:
        print(
            f"| {store_name} | {op} | {theirs_rate:,.0f} | {ours_rate:,.0f} "
            f"| {ours_rate / theirs_rate:.2f}x |"
        )


if __name__ == "__main__":
    main()
