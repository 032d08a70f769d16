"""Sparse all-reduce on gloo, ferrodist vs torch, side by side in one run.

ferrodist sums a sparse COO tensor with dense all-gathers of its own (sizes and ``nnz``, then
indices and values padded to the largest ``nnz``: ``ferrodist._sparse_all_reduce``) instead of
gloo's sparse all-reduce, which corrupts the heap now and then beside dense work. This bench
says what that costs: ``torch.distributed.all_reduce`` and ``ferrodist.all_reduce`` of the same
embedding-gradient-shaped sparse tensor (a table of V rows of D floats, one row per token, with
repeats, as ``nn.Embedding(sparse=True)`` produces), interleaved call by call (ABBA) in one
world so machine noise hits both alike. Each rank draws its own tokens, so ``nnz`` differs by
rank and ferrodist's padding is paid. The input is cloned before each call (both reduce in
place), and the clone is timed on both sides.

Then a DDP step of torch's DDP and ferrodist's on a model with a sparse embedding, the two
taking turns step by step: what a user of ``nn.EmbeddingBag(sparse=True)`` sees.

Beside the times: the bytes each rank receives (gloo's all-gather-v: every rank's exact
entries; ferrodist's: every rank's entries padded to the largest) and, as the floor that no
exchange beats, the time to copy those bytes once in memory on this machine (loopback is a
memory copy; a real link is slower, and then bytes matter more).

torch's side runs gloo's sparse all-reduce in a process that has ferrodist's extension loaded,
where that defect is most frequent; alone (no dense work beside it) it has not faulted here, but
each world has a deadline, and a world that dies or hangs is reported as such.

Prints a markdown table (ratios ferrodist / torch; below 1 is faster).
Usage: ``./scripts/bench benches/bench_sparse_all_reduce.py [--calls N] [--world W]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _subprocess_world import run_world

#: (name, table rows, row width, tokens per rank)
SHAPES = [
    ("small table: 1,000 x 16, 64 tokens", 1_000, 16, 64),
    ("word embedding: 50,000 x 128, 2,048 tokens", 50_000, 128, 2_048),
    ("recommender table: 1,000,000 x 64, 16,384 tokens", 1_000_000, 64, 16_384),
]


def _gradient(rows: int, width: int, tokens: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rows, (1, tokens), generator=g)
    values = torch.randn(tokens, width, generator=g)
    return torch.sparse_coo_tensor(ids, values, (rows, width)).coalesce()


def worker(rank: int, world: int, port: int, calls: int) -> None:
    import torch
    import torch.distributed as tdist

    import ferrodist

    torch.set_num_threads(1)
    tdist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    result = {}
    for name, rows, width, tokens in SHAPES:
        grad = _gradient(rows, width, tokens, seed=rank)
        nnz = torch.tensor([grad._nnz()])
        every = [torch.zeros_like(nnz) for _ in range(world)]
        tdist.all_gather(every, nnz)
        counts = [int(n) for n in every]
        entry = 8 + 4 * width  # one int64 index and a row of floats
        pair = [("torch", tdist.all_reduce), ("ferrodist", ferrodist.all_reduce)]
        for _, fn in pair:  # warm-up
            fn(grad.clone())
        reference = grad.clone()
        tdist.all_reduce(reference)
        mine = grad.clone()
        ferrodist.all_reduce(mine)
        same = torch.equal(reference._indices(), mine._indices()) and torch.equal(
            reference._values(), mine._values()
        )
        per: dict[str, list[float]] = {"torch": [], "ferrodist": []}
        tdist.barrier()
        for i in range(calls):
            for side, fn in pair if i % 2 == 0 else pair[::-1]:
                start = time.perf_counter()
                fn(grad.clone())
                per[side].append(time.perf_counter() - start)
        received = {"torch": sum(counts) * entry, "ferrodist": world * max(counts) * entry}
        buffer = torch.empty(received["ferrodist"] // 4 + 1)
        copies = []
        for _ in range(5):
            start = time.perf_counter()
            buffer.clone()
            copies.append(time.perf_counter() - start)
        result[name] = {
            "times": {k: (min(v), statistics.median(v)) for k, v in per.items()},
            "received": received,
            "copy_floor": min(copies) * received["torch"] / received["ferrodist"],
            "nnz": counts,
            "same_bits": same,
        }
    result["ddp"] = _ddp_steps(rank, calls)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    tdist.destroy_process_group()


def _ddp_steps(rank: int, steps: int) -> dict:
    """Median step (forward, backward, SGD step) of torch's DDP and ferrodist's on a model with a
    sparse embedding (50,000 x 128, ``EmbeddingBag(sparse=True)``) before a 3-layer MLP of
    width 512, batch 64 bags of 32 tokens; the two DDPs take turns step by step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from ferrodist.nn import DistributedDataParallel as FerroDDP

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.EmbeddingBag(50_000, 128, sparse=True),
            torch.nn.Linear(128, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 10),
        )

    sides = {}
    for side, cls in (("torch", TorchDDP), ("ferrodist", FerroDDP)):
        ddp = cls(model())
        sides[side] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(rank)
    per: dict[str, list[float]] = {"torch": [], "ferrodist": []}
    for step in range(steps + 2):
        ids = torch.randint(0, 50_000, (64, 32), generator=g)
        order = list(sides.items()) if step % 2 == 0 else list(sides.items())[::-1]
        for side, (ddp, opt) in order:
            start = time.perf_counter()
            ddp(ids).square().mean().backward()
            opt.step()
            opt.zero_grad()
            if step >= 2:  # the first two steps rebuild the buckets
                per[side].append(time.perf_counter() - start)
    return {side: (min(v), statistics.median(v)) for side, v in per.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=40, help="calls per side and shape")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        rank, world, port = (int(x) for x in args.worker)
        worker(rank, world, port, args.calls)
        return
    result = run_world(__file__, args.world, [], ["--calls", str(args.calls)])
    print(f"world {args.world}, gloo over loopback, {args.calls} calls a side, best (median)\n")
    print(
        "| shape (nnz per rank) | torch | ferrodist | ratio | received by a rank, torch / "
        "ferrodist | memory-copy floor of torch's bytes | same bits |"
    )
    print("|---|---|---|---|---|---|---|")
    ddp = result.pop("ddp")
    for name, r in result.items():
        (tb, tm), (fb, fm) = r["times"]["torch"], r["times"]["ferrodist"]
        rt, rf = r["received"]["torch"], r["received"]["ferrodist"]
        print(
            f"| {name} ({', '.join(str(n) for n in r['nnz'])}) "
            f"| {tb * 1e3:,.2f} ({tm * 1e3:,.2f}) ms | {fb * 1e3:,.2f} ({fm * 1e3:,.2f}) ms "
            f"| {fb / tb:.2f}x ({fm / tm:.2f}x) | {rt / 2**20:,.2f} / {rf / 2**20:,.2f} MiB "
            f"| {r['copy_floor'] * 1e3:,.3f} ms | {'yes' if r['same_bits'] else 'NO'} |",
            flush=True,
        )

    (tb, tm), (fb, fm) = ddp["torch"], ddp["ferrodist"]
    print(
        "\nDDP step, EmbeddingBag(50,000, 128, sparse=True) + MLP 128-512-512-10, 64 bags of 32 "
        f"tokens: torch {tb * 1e3:,.2f} ({tm * 1e3:,.2f}) ms, ferrodist {fb * 1e3:,.2f} "
        f"({fm * 1e3:,.2f}) ms, ratio {fb / tb:.2f}x ({fm / tm:.2f}x)",
        flush=True,
    )


if __name__ == "__main__":
    main()
