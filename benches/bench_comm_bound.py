"""Where the link is the limit: ferrodist vs torch on the multi-host lab (benches/lab).

Two hosts (network namespaces) joined by a bridge, each host's link shaped to ``--rate``
(1 Gbit/s by default, both directions), one gloo rank per host. On each model, torch's and
ferrodist's wrapper take turns step by step in the same two processes (who goes first
alternates), and each row prints:

* the median step time (forward, backward, gradient sync, SGD) of each and their ratio
  (ferrodist / torch);
* the bytes each rank put on the wire per step (its interface's tx counter around the step,
  headers included: what the shaper counts);
* the link floor, those bytes at the link rate, and the compute-only time (the same model
  trained without any communication, in the same processes, in the same rounds);
* how far each step is from ``max(floor, compute)``, the best a perfect overlap could reach.

Models: ``large`` has a few large tensors (8 x Linear(2048, 2048), 33.6M parameters, 16
tensors), ``many`` has hundreds (300 x Linear(256, 256), 19.7M parameters, 600 tensors);
256 rows a step. Wrappers (``--wrappers``): ``ddp``; FSDP with one unit per Linear, ``fsdp``
(FULL_SHARD) and ``fsdp_sgo`` (SHARD_GRAD_OP); ``zero``, DDP with each side's
ZeroRedundancyOptimizer over SGD (ferrodist's ``overlap_with_forward`` is timed by
``bench_zero_overlap.py``, see ``_ZERO``); ``fsdp_hybrid``, HYBRID_SHARD sharding within a
host and replicating across hosts, with ``--ranks-per-host 2`` (4 ranks; each host's two ranks
talk over its loopback, so the link counters hold only the traffic between hosts); ``fsdp_fp``
and ``fsdp_sgo_fp``, FULL_SHARD and SHARD_GRAD_OP with ``forward_prefetch=True`` on both sides.

    ./scripts/bench benches/bench_comm_bound.py [--rate 1gbit|10gbit|unshaped]
        [--models large,many] [--wrappers ddp,fsdp,fsdp_sgo,zero] [--steps 5] [--warmup 1]

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


def _model(layers: int, width: int) -> Any:
    import torch

    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


def _wrap(kind: str, wrapper: str, model: Any) -> Any:
    import torch

    if wrapper == "ddp" or wrapper in _ZERO:
        if kind == "torch":
            from torch.nn.parallel import DistributedDataParallel as TorchDDP

            return TorchDDP(model)
        from ferrodist.nn import DistributedDataParallel as FerroDDP

        return FerroDDP(model)
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    impl: Any = TorchFSDP
    if kind == "ferrodist":
        from ferrodist.fsdp import FullyShardedDataParallel as impl
    extra: dict[str, Any] = {}
    if wrapper.endswith("_fp"):  # both sides asked to gather the next unit during a forward
        extra["forward_prefetch"] = True
    if wrapper == "fsdp_hybrid":
        # Shard within a host, replicate across hosts: ranks host * local_size + local.
        import os

        from torch.distributed.device_mesh import init_device_mesh

        local_size = int(os.environ["LOCAL_WORLD_SIZE"])
        shape = (int(os.environ["WORLD_SIZE"]) // local_size, local_size)
        extra["device_mesh"] = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
    return impl(
        model,
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        sharding_strategy=ShardingStrategy[_STRATEGIES[wrapper]],
        device_id=torch.device("cpu"),
        **extra,
    )


_STRATEGIES = {
    "fsdp": "FULL_SHARD",
    "fsdp_sgo": "SHARD_GRAD_OP",
    "fsdp_hybrid": "HYBRID_SHARD",
    "fsdp_fp": "FULL_SHARD",
    "fsdp_sgo_fp": "SHARD_GRAD_OP",
}
"""``--wrappers`` names of the FSDP rows and their sharding strategies."""


def _optimizer(kind: str, wrapper: str, module: Any) -> Any:
    """SGD; under the ``zero`` row sharded by each side's ZeroRedundancyOptimizer."""
    import torch

    if kind == "compute" or wrapper not in _ZERO:
        return torch.optim.SGD(module.parameters(), lr=1e-4)
    if kind == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer
    else:
        from ferrodist.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(module.parameters(), optimizer_class=torch.optim.SGD, lr=1e-4)


_ZERO = {"zero": "DDP + ZeRO"}
"""``--wrappers`` name of the ZeRO row (DDP with ZeroRedundancyOptimizer) and its label. No row
here for ferrodist's ``overlap_with_forward``: its broadcasts stay in flight after ``step()``,
and with the two sides taking turns step by step they would run during the other side's turn
and leave the step that issued them. ``bench_zero_overlap.py`` times it in blocks of
consecutive steps, the in-flight tail included."""


def _stepper(module: Any, x: Any, optim: Any = None) -> Callable[[], None]:
    import torch

    optim = optim if optim is not None else torch.optim.SGD(module.parameters(), lr=1e-4)

    def step() -> None:
        module(x).square().mean().backward()
        optim.step()
        optim.zero_grad()

    return step


def _worker(args: argparse.Namespace) -> None:
    """One rank, inside a lab host: times every (model, wrapper) row, rank 0 prints them."""
    import torch
    import torch.distributed as dist

    from benches.lab import local_bytes

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group("gloo")
    rows = []
    for name in args.models.split(","):
        layers, width = MODELS[name]
        base = _model(layers, width)
        x = torch.randn(args.batch, width)
        tensors = sum(1 for _ in base.parameters())
        params = sum(p.numel() for p in base.parameters())
        for wrapper in args.wrappers.split(","):
            modules = {k: _wrap(k, wrapper, _model(layers, width)) for k in ("torch", "ferrodist")}
            steps = {k: _stepper(m, x, _optimizer(k, wrapper, m)) for k, m in modules.items()}
            steps["compute"] = _stepper(_model(layers, width), x)
            times: dict[str, list[float]] = {k: [] for k in steps}
            sent: dict[str, list[int]] = {k: [] for k in steps}
            for round_ in range(args.warmup + args.steps):
                order = ["torch", "ferrodist"] if round_ % 2 else ["ferrodist", "torch"]
                for kind in [*order, "compute"]:
                    dist.barrier()
                    tx = local_bytes()[0]
                    start = time.perf_counter()
                    steps[kind]()
                    elapsed = time.perf_counter() - start
                    if round_ >= args.warmup:
                        times[kind].append(elapsed)
                        sent[kind].append(local_bytes()[0] - tx)
            rows.append(
                {
                    "model": name,
                    "layers": layers,
                    "width": width,
                    "tensors": tensors,
                    "params": params,
                    "wrapper": wrapper,
                    "time": {k: statistics.median(v) for k, v in times.items()},
                    "bytes": {k: statistics.median(v) for k, v in sent.items()},
                }
            )
            del steps, modules
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def _print(rows: list[dict[str, Any]], rate_bps: float, args: argparse.Namespace) -> None:
    rate = f"{rate_bps / 1e9:g} Gbit/s" if rate_bps else "unshaped"
    per = "rank" if args.ranks_per_host == 1 else "host (its ranks together)"
    print(
        f"\nComm-bound step time: 2 hosts x {args.ranks_per_host} gloo rank(s) on the lab, "
        f"{rate} per host link (both directions), batch {args.batch}, SGD, median of "
        f"{args.steps} steps, both sides taking turns; MB/step: what each {per} put on its "
        f"link; floor = those bytes / link rate, bound = max(floor, compute)\n"
    )
    print(
        "| model | wrapper | compute only | torch step | ferrodist step | ratio "
        "| torch MB/step | ferrodist MB/step | torch floor | ferrodist floor "
        "| torch / bound | ferrodist / bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t, b = r["time"], r["bytes"]
        compute = t["compute"]
        floor = {k: b[k] * 8 / rate_bps if rate_bps else 0.0 for k in ("torch", "ferrodist")}
        bound = {k: max(floor[k], compute) for k in floor}
        model = (
            f"{r['model']}: {r['layers']} x Linear({r['width']}, {r['width']}), "
            f"{r['params'] / 1e6:.1f}M params, {r['tensors']} tensors"
        )
        wrapper = (
            "DDP"
            if r["wrapper"] == "ddp"
            else _ZERO.get(r["wrapper"])
            or f"FSDP {_STRATEGIES[r['wrapper']]}"
            + (", forward_prefetch" if r["wrapper"].endswith("_fp") else "")
        )
        print(
            f"| {model} | {wrapper} | {compute:.2f} s | {t['torch']:.2f} s | "
            f"{t['ferrodist']:.2f} s | {t['ferrodist'] / t['torch']:.2f}x | "
            f"{b['torch'] / 1e6:.0f} | {b['ferrodist'] / 1e6:.0f} | {floor['torch']:.2f} s | "
            f"{floor['ferrodist']:.2f} s | {t['torch'] / bound['torch']:.2f}x | "
            f"{t['ferrodist'] / bound['ferrodist']:.2f}x |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--models", default="large,many")
    parser.add_argument("--wrappers", default="ddp,fsdp,fsdp_sgo,zero")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument(
        "--ranks-per-host", type=int, default=1, help="2 for the fsdp_hybrid row (4 ranks)"
    )
    sys.path.insert(0, str(REPO))
    from benches.lab import lab_main

    return lab_main(parser, _worker, _print, "bench_comm_bound", __file__)


if __name__ == "__main__":
    sys.exit(main())
