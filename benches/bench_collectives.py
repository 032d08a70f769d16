"""Control collectives and bucket assignment: ferrodist vs torch, side by side in one run.

Collectives: ``world`` ranks as threads of this process, each with its own store client,
run one round of 5 all_gathers, a barrier and an all_sum (fresh keys every round). Figures
are the median wall time of a round (all ranks done), for

* torch's ``_StoreCollectives`` on torch's ``TCPStore`` (the baseline),
* ferrodist's ``StoreCollectives`` on the same torch ``TCPStore`` (through the adapter),
* ferrodist on ``ferrodist.HashStore`` (in process) and, when it exists, ``ferrodist.TCPStore``.

Bucket assignment: ``n`` CPU float tensors of 1..256 elements with DDP's default limits
(1 MiB, then 25 MiB), through torch's tensor API, ferrodist's tensor API and ferrodist's
metadata API (numpy arrays of byte sizes, dtype ids and device ids).

Usage: ``./scripts/bench benches/bench_collectives.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

import ferrodist
from ferrodist.bucketing import (
    compute_bucket_assignment_by_size,
    compute_bucket_assignment_by_size_from_metadata,
    device_id,
    dtype_id,
)

TIMEOUT = timedelta(seconds=120)
Row = tuple[str, float, float]


def collective_round(world: int, make_collectives: Callable[[int], Any], tag: str) -> float:
    """Seconds until every rank has finished 5 all_gathers, a barrier and an all_sum."""
    ranks = [make_collectives(r) for r in range(world)]
    start = threading.Barrier(world + 1)
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        c = ranks[rank]
        start.wait()
        try:
            for i in range(5):
                c.all_gather(f"{tag}/ag{i}", f"rank-{rank}-payload", TIMEOUT)
            c.barrier(f"{tag}/b", TIMEOUT)
            c.all_sum(f"{tag}/s", rank, TIMEOUT)
        except BaseException as err:  # surfaced after join
            errors.append(err)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    return elapsed


def torch_tcp_clients(world: int) -> Callable[[int], tdist.Store]:
    server = tdist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    port = server.port
    keep = [server]

    def client(_rank: int) -> tdist.Store:
        store = tdist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=TIMEOUT)
        keep.append(store)
        return store

    return client


def ferrodist_tcp_clients(world: int) -> Callable[[int], tdist.Store] | None:
    tcp = getattr(ferrodist, "TCPStore", None)
    if tcp is None:
        return None
    server = tcp("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    port = server.port
    keep = [server]

    def client(_rank: int) -> tdist.Store:
        store = tcp("127.0.0.1", port, world, is_master=False, timeout=TIMEOUT)
        keep.append(store)
        return store

    return client


def median_round(world: int, rounds: int, factory: Callable[[int], Any], name: str) -> float:
    times = [collective_round(world, factory, f"{name}-{n}") for n in range(rounds)]
    return statistics.median(times) * 1e3


def bench_collectives(world: int, rounds: int) -> list[Row]:
    torch_clients = torch_tcp_clients(world)
    base = median_round(
        world, rounds, lambda r: tdist._StoreCollectives(torch_clients(r), r, world), "torch"
    )
    rows: list[Row] = [(f"world {world}: torch `_StoreCollectives` on torch TCPStore", base, base)]
    ours_on_torch = torch_tcp_clients(world)
    rows.append(
        (
            f"world {world}: ferrodist on torch TCPStore (adapter)",
            median_round(
                world, rounds, lambda r: ferrodist.StoreCollectives(ours_on_torch(r), r, world), "a"
            ),
            base,
        )
    )
    shared = ferrodist.HashStore()
    rows.append(
        (
            f"world {world}: ferrodist on ferrodist.HashStore",
            median_round(
                world, rounds, lambda r: ferrodist.StoreCollectives(shared, r, world), "h"
            ),
            base,
        )
    )
    ferro_tcp = ferrodist_tcp_clients(world)
    if ferro_tcp is not None:
        rows.append(
            (
                f"world {world}: ferrodist on ferrodist.TCPStore",
                median_round(
                    world, rounds, lambda r: ferrodist.StoreCollectives(ferro_tcp(r), r, world), "t"
                ),
                base,
            )
        )
    return rows


def best_of(repeats: int, call: Callable[[], object]) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def bench_buckets(n: int, repeats: int, mixed: bool = False) -> list[Row]:
    """Bucket assignment of ``n`` small CPU tensors; ``mixed``: float32, float16 and bfloat16
    in turn (three groups filled side by side), else all float32."""
    rng = np.random.default_rng(0)
    kinds = (torch.float32, torch.float16, torch.bfloat16) if mixed else (torch.float32,)
    tensors = [
        torch.empty(int(k), dtype=kinds[i % len(kinds)])
        for i, k in enumerate(rng.integers(1, 257, size=n))
    ]
    limits = [1 << 20, 25 << 20]
    sizes = np.array([t.nbytes for t in tensors], dtype=np.int64)
    dtypes = np.array([dtype_id(t.dtype) for t in tensors], dtype=np.int64)
    devices = np.full(n, device_id("cpu"), dtype=np.int64)
    expected = tdist._compute_bucket_assignment_by_size(tensors, limits)
    assert compute_bucket_assignment_by_size(tensors, limits) == expected
    assert compute_bucket_assignment_by_size_from_metadata(sizes, dtypes, devices, limits) == (
        expected
    )
    base = best_of(repeats, lambda: tdist._compute_bucket_assignment_by_size(tensors, limits))
    tensor_api = best_of(repeats, lambda: compute_bucket_assignment_by_size(tensors, limits))
    metadata_api = best_of(
        repeats,
        lambda: compute_bucket_assignment_by_size_from_metadata(sizes, dtypes, devices, limits),
    )
    what = f"buckets, {n // 1000}k tensors{', 3 dtypes' if mixed else ''}"
    return [
        (f"{what}: torch tensor API", base, base),
        (f"{what}: ferrodist tensor API", tensor_api, base),
        (f"{what}: ferrodist metadata API", metadata_api, base),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="collective rounds per figure")
    parser.add_argument("--repeats", type=int, default=7, help="bucket runs per figure (best)")
    args = parser.parse_args()
    rows: list[Row] = []
    for world in (8, 64):
        rows += bench_collectives(world, args.rounds)
    for n in (10_000, 100_000):
        rows += bench_buckets(n, args.repeats)
    rows += bench_buckets(100_000, args.repeats, mixed=True)
    print("| figure | ferrodist or torch (ms) | torch (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for name, value, base in rows:
        print(f"| {name} | {value:.2f} | {base:.2f} | {value / base:.2f}x |")


if __name__ == "__main__":
    main()
