"""Process groups, ferrodist vs torch, side by side in one run (gloo on CPU).

1. ``all_reduce`` latency from 4 B to 64 MiB at world 2: the same default group, torch's
   ``torch.distributed.all_reduce`` and ``ferrodist.all_reduce`` interleaved call by call (ABBA)
   so machine noise hits both alike; the best and the median single-call time of each (on a
   shared, loaded machine the best call is the least disturbed one).
2. The per-call Python overhead alone: the same at world 1 (gloo, no peer), 4 B.
3. ``init_process_group`` wall time at world 2 and 8 over ``tcp://`` (the store hosted in rank 0):
   torch's and ferrodist's, alternated; each trial is the slowest rank's time from a common start
   (a barrier on a separate control store) to its return; best and median over trials.

The table shows "best (median)" for each side and the ratio of each.

Prints a markdown table with ratios (ferrodist / torch; below 1 is faster).
Usage: ``./scripts/bench benches/bench_process_group.py [--trials N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import timedelta

from _subprocess_world import free_port as _port
from _subprocess_world import run_world as subprocess_world

SIZES = [4, 64, 1024, 16 << 10, 256 << 10, 4 << 20, 64 << 20]


def _human(n: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n // size} {unit}"
    return f"{n} B"


def _control(rank: int, world: int, port: int):
    import torch.distributed as tdist

    return tdist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=300))


def worker_allreduce(rank: int, world: int, port: int, trials: int) -> None:
    import torch
    import torch.distributed as tdist

    import ferrodist as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    result = {}
    for size in SIZES if world > 1 else SIZES[:1]:
        t = torch.ones(max(size // 4, 1), dtype=torch.float32)
        calls = trials * max(4, min(100, (4 << 20) // size))
        per: dict[str, list[float]] = {"torch": [], "ferrodist": []}
        pair = [("torch", tdist.all_reduce), ("ferrodist", dist.all_reduce)]
        for _, fn in pair:  # warm-up
            fn(t)
        tdist.barrier()
        for i in range(calls):
            # call by call, in ABBA order, so load changes hit both sides alike
            for name, fn in pair if i % 2 == 0 else pair[::-1]:
                start = time.perf_counter()
                fn(t)
                per[name].append(time.perf_counter() - start)
        result[size] = {k: (min(v), statistics.median(v)) for k, v in per.items()}
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def worker_init(rank: int, world: int, port: int, trials: int) -> None:
    import torch.distributed as tdist

    import ferrodist as dist

    control = _control(rank, world, port)
    times: dict[str, list[float]] = {"torch": [], "ferrodist": []}
    for trial in range(trials):
        for name, init in (
            ("torch", tdist.init_process_group),
            ("ferrodist", dist.init_process_group),
        ):
            key = f"{name}/{trial}"
            control.add(key + "/ready", 1)
            if rank == 0:
                while int(control.add(key + "/ready", 0)) < world:
                    time.sleep(0.001)
                control.set(key + "/go", str(_port()))
            control.wait([key + "/go"])
            pg_port = int(control.get(key + "/go"))
            start = time.perf_counter()
            init("gloo", init_method=f"tcp://127.0.0.1:{pg_port}", rank=rank, world_size=world)
            control.set(f"{key}/t/{rank}", str(time.perf_counter() - start))
            # every rank done before any tears down (rank 0's teardown stops the store server)
            control.wait([f"{key}/t/{r}" for r in range(world)])
            tdist.destroy_process_group()
            if rank == 0:
                times[name].append(max(float(control.get(f"{key}/t/{r}")) for r in range(world)))
    if rank == 0:
        stats = {k: (min(v), statistics.median(v)) for k, v in times.items()}
        print("RESULT " + json.dumps(stats), flush=True)
    control.add("done", 1)
    if rank == 0:
        while int(control.add("done", 0)) < world:
            time.sleep(0.01)


def run_world(mode: str, world: int, trials: int) -> dict:
    result: dict = subprocess_world(__file__, world, [mode], ["--trials", str(trials)])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        mode, rank, world, port = args.worker
        fn = worker_allreduce if mode == "allreduce" else worker_init
        fn(int(rank), int(world), int(port), args.trials)
        return

    print("| what | torch best (median) | ferrodist best (median) | ratio best (median) |")
    print("|---|---|---|---|")

    def row(what: str, r: dict, scale: float, unit: str) -> None:
        (tb, tm), (fb, fm) = r["torch"], r["ferrodist"]
        print(
            f"| {what} | {tb * scale:,.1f} ({tm * scale:,.1f}) {unit} "
            f"| {fb * scale:,.1f} ({fm * scale:,.1f}) {unit} | {fb / tb:.3f}x ({fm / tm:.3f}x) |",
            flush=True,
        )

    lat = run_world("allreduce", 2, args.trials)
    for size in SIZES:
        row(f"all_reduce {_human(size)}, world 2", lat[str(size)], 1e6, "µs")
    row(
        "all_reduce 4 B, world 1 (per-call overhead)",
        run_world("allreduce", 1, 3 * args.trials)["4"],
        1e6,
        "µs",
    )
    for world in (2, 8):
        r = run_world("init", world, args.trials)
        row(f"init_process_group tcp://, world {world}", r, 1e3, "ms")


if __name__ == "__main__":
    main()
