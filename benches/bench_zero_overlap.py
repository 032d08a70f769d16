"""ZeRO where the link is the limit: the post-step broadcast overlapped with the next forward.

Two hosts of the multi-host lab (benches/lab), one gloo rank each, each host's link shaped to
``--rate`` (1 Gbit/s by default). Every rank trains with rank-local gradients (no gradient
sync, so what is timed is ZeRO's own traffic: the broadcast of the updated shards) and Adam:

* ``torch``: torch's ``ZeroRedundancyOptimizer``, synchronous ``step()``;
* ``ferrodist``: ferrodist's, synchronous ``step()`` (the default);
* ``ferrodist overlap``: ferrodist's with ``overlap_with_forward(model)``: ``step()`` leaves
  the broadcasts in flight, each layer's forward waits for its own parameters;
* ``compute``: the same model and data with a local Adam over every parameter, no traffic.

A step is forward + backward + ``step()``. Each implementation runs ``--block`` consecutive
steps at a time (the overlap needs the next forward to be its own), timed as one block whose
end includes waiting for whatever is still in flight; the implementations take turns block by
block (who goes first rotates); a row prints the median over ``--rounds`` blocks of the time
per step, the bytes each rank put on the wire per step (its interface's tx counter, headers
included), the link floor (those bytes at the link rate) and each side's ratio to torch.

    ./scripts/bench benches/bench_zero_overlap.py [--rate 1gbit|10gbit|unshaped]
        [--models large,many] [--rounds 3] [--block 3]

Needs root (network namespaces, ``tc``); elsewhere it says why and measures nothing.
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
MODELS = {"large": (8, 2048), "many": (300, 256)}  # (layers, width) of an MLP
KINDS = ("torch", "ferrodist", "ferrodist overlap", "compute")


def _model(layers: int, width: int) -> Any:
    import torch

    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


def _setup(kind: str, layers: int, width: int, x: Any) -> tuple[Callable[[], None], Any]:
    """(one training step, what finishes the block)."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    from ferrodist.optim import ZeroRedundancyOptimizer as FerroZero

    model = _model(layers, width)
    finish: Callable[[], None] = lambda: None  # noqa: E731
    if kind == "compute":
        optim: Any = torch.optim.Adam(model.parameters(), lr=1e-5)
    elif kind == "torch":
        optim = TorchZero(model.parameters(), torch.optim.Adam, lr=1e-5)
    else:
        optim = FerroZero(model.parameters(), torch.optim.Adam, lr=1e-5)
        if kind == "ferrodist overlap":
            optim.overlap_with_forward(model)
            finish = optim.wait_for_params

    def step() -> None:
        model(x).square().mean().backward()
        optim.step()
        optim.zero_grad()

    return step, finish


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from benches.lab import local_bytes

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group("gloo")
    rows = []
    for name in args.models.split(","):
        layers, width = MODELS[name]
        x = torch.randn(args.batch, width)
        setups = {kind: _setup(kind, layers, width, x) for kind in KINDS}
        for step, finish in setups.values():  # warm-up: Adam state, first-call costs
            step()
            finish()
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        sent: dict[str, list[float]] = {k: [] for k in KINDS}
        for round_ in range(args.rounds):
            shift = round_ % 3
            order = [*KINDS[:3][shift:], *KINDS[:3][:shift], "compute"]
            for kind in order:
                step, finish = setups[kind]
                dist.barrier()
                tx = local_bytes()[0]
                start = time.perf_counter()
                for _ in range(args.block):
                    step()
                finish()
                times[kind].append((time.perf_counter() - start) / args.block)
                sent[kind].append((local_bytes()[0] - tx) / args.block)
        rows.append(
            {
                "model": name,
                "layers": layers,
                "width": width,
                "params": sum(p.numel() for p in _model(layers, width).parameters()),
                "time": {k: statistics.median(v) for k, v in times.items()},
                "bytes": {k: statistics.median(v) for k, v in sent.items()},
            }
        )
        del setups
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def _print(rows: list[dict[str, Any]], rate_bps: float, args: argparse.Namespace) -> None:
    rate = f"{rate_bps / 1e9:g} Gbit/s" if rate_bps else "unshaped"
    print(
        f"\nZeRO step (forward + backward + step, Adam, rank-local gradients): 2 hosts x 1 gloo "
        f"rank on the lab, {rate} per host link, batch {args.batch}, median of {args.rounds} "
        f"blocks of {args.block} steps, taking turns; floor = bytes sent / link rate\n"
    )
    print(
        "| model | compute only | torch | ferrodist | ferrodist overlap | ferrodist / torch "
        "| overlap / torch | MB/step (torch / ferrodist / overlap) | floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, b = r["time"], r["bytes"]
        floor = b["ferrodist overlap"] * 8 / rate_bps if rate_bps else 0.0
        model = (
            f"{r['model']}: {r['layers']} x Linear({r['width']}, {r['width']}), "
            f"{r['params'] / 1e6:.1f}M params"
        )
        print(
            f"| {model} | {t['compute']:.2f} s | {t['torch']:.2f} s | {t['ferrodist']:.2f} s | "
            f"{t['ferrodist overlap']:.2f} s | {t['ferrodist'] / t['torch']:.2f}x | "
            f"{t['ferrodist overlap'] / t['torch']:.2f}x | {b['torch'] / 1e6:.0f} / "
            f"{b['ferrodist'] / 1e6:.0f} / {b['ferrodist overlap'] / 1e6:.0f} | {floor:.2f} s |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--models", default="large,many")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    sys.path.insert(0, str(REPO))
    from benches.lab import lab_main

    return lab_main(parser, _worker, _print, "bench_zero_overlap", __file__)


if __name__ == "__main__":
    sys.exit(main())
