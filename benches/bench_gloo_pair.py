"""Moving a tensor both ways between two hosts over gloo: which forms run at the link's rate.

On the multi-host lab (2 hosts, one gloo rank each, each link shaped to ``--rate``), every row
moves ``--mb`` megabytes from each rank to the other (what an all-gather or a broadcast pair
of two ranks moves) and prints its time against the link's floor (bytes / rate; the link is
full duplex, so both directions share that floor). The rows are torch's collectives as they
are, the same transfer as ``isend`` then ``irecv`` and as ``irecv`` then ``isend``, and
ferrodist's composed forms (``ferrodist._exchange``, which FSDP and ZeRO use on gloo at two
ranks). An all-reduce of the same tensor is the control: gloo's ring sends it in small pieces
and reaches the link's rate.

    ./scripts/bench benches/bench_gloo_pair.py [--rate 1gbit] [--mb 67] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from ferrodist import _exchange

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    me = dist.get_rank()
    peer = 1 - me
    n = int(args.mb * 1e6 / 4)
    mine = torch.full((n,), float(me + 1))
    theirs = torch.empty(n)
    gathered = torch.empty(2 * n)
    halves = list(gathered.view(2, n))

    def send_first() -> None:
        sent = dist.isend(mine, peer)
        got = dist.irecv(theirs, peer)
        sent.wait()
        got.wait()

    def receive_first() -> None:
        got = dist.irecv(theirs, peer)
        sent = dist.isend(mine, peer)
        sent.wait()
        got.wait()

    def broadcast_pair() -> None:
        halves[me].copy_(mine)
        for work in [dist.broadcast(halves[r], r, async_op=True) for r in range(2)]:
            work.wait()

    cases: dict[str, Callable[[], Any]] = {
        "torch isend, then irecv": send_first,
        "torch irecv, then isend": receive_first,
        "torch all_gather_into_tensor": lambda: dist.all_gather_into_tensor(gathered, mine),
        "torch all_to_all_single": lambda: dist.all_to_all_single(gathered, mine.repeat(2)),
        "torch broadcast x 2, async": broadcast_pair,
        "ferrodist all-gather by exchange": lambda: _exchange.all_gather(gathered, mine),
        "ferrodist broadcasts by exchange": lambda: _exchange.broadcast_each(halves, [0, 1]),
        "control: torch all_reduce": lambda: dist.all_reduce(mine),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.reps + 1):
        for name, fn in cases.items():
            dist.barrier()
            start = time.perf_counter()
            fn()
            if rep:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    if me == 0:
        print("RESULT " + json.dumps([{k: statistics.median(v) for k, v in times.items()}]))
    dist.destroy_process_group()


def _print(rows: list[dict[str, Any]], rate_bps: float, args: argparse.Namespace) -> None:
    floor = args.mb * 1e6 * 8 / rate_bps if rate_bps else float("nan")
    print(
        f"{args.mb:g} MB each way between 2 hosts, gloo, {rate_bps / 1e9:g} Gbit/s per link "
        f"(full duplex): floor {floor:.3f} s; median of {args.reps}\n"
    )
    print("| form | time | x floor |\n|---|---|---|")
    for name, seconds in rows[0].items():
        print(f"| {name} | {seconds:.3f} s | {seconds / floor:.2f}x |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--mb", type=float, default=67.0, help="megabytes each way")
    parser.add_argument("--reps", type=int, default=5)
    sys.path.insert(0, str(REPO))
    from benches.lab import lab_main

    return lab_main(parser, _worker, _print, "bench_gloo_pair", __file__)


if __name__ == "__main__":
    sys.exit(main())
