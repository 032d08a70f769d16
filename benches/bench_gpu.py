"""DDP and FSDP on one GPU with NCCL (world 1): ferrodist's against torch's, taking turns.

World 1 is all a one-GPU machine offers NCCL; it still measures what ferrodist adds on the
device: hooks, bucket copies, flat-parameter views and casts, the CPU-offload copies, and the
Python bookkeeping per step, with the collectives themselves reduced to NCCL's local copies.
The models are bench_fsdp's (a ~50M-parameter transformer, a model of 2,000 parameter tensors).

Each round runs one step of every implementation in turn (who goes first alternates), with
``torch.cuda.synchronize()`` around each timed step; the figure is the median over the rounds.
Prints a markdown table; ratio = ferrodist / torch (lower is better). A third stepper runs the
same ferrodist model with the flight recorder off, in the same rounds: "recording adds" is the
recorder's share of a ferrodist step on the device.
Run on a CUDA machine: ``python benches/bench_gpu.py`` (``--quick``: small models, few steps).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fsdp import build


def _fsdp(impl: Any, block: type[nn.Module], offload: bool) -> Callable[[nn.Module], nn.Module]:
    from torch.distributed.fsdp import CPUOffload, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return lambda model: impl(  # type: ignore[no-any-return]
        model,
        auto_wrap_policy=ModuleWrapPolicy({block}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        cpu_offload=CPUOffload(offload_params=offload),
        device_id=torch.cuda.current_device(),
    )


def _ddp(impl: Any) -> Callable[[nn.Module], nn.Module]:
    return lambda model: impl(model.cuda(), device_ids=[torch.cuda.current_device()])


def variants(block: type[nn.Module]) -> dict[str, dict[str, Callable[[nn.Module], nn.Module]]]:
    """variant -> {implementation -> wrap(model)}."""
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP
    from ferrodist.nn import DistributedDataParallel as FerroDDP

    return {
        "DDP": {"torch": _ddp(TorchDDP), "ferrodist": _ddp(FerroDDP)},
        "FSDP FULL_SHARD": {
            "torch": _fsdp(TorchFSDP, block, False),
            "ferrodist": _fsdp(FerroFSDP, block, False),
        },
        "FSDP FULL_SHARD + CPUOffload": {
            "torch": _fsdp(TorchFSDP, block, True),
            "ferrodist": _fsdp(FerroFSDP, block, True),
        },
    }


def _step(model: nn.Module, optim: torch.optim.Optimizer, data: Any, step: int) -> None:
    x, loss_fn = data(step)
    loss_fn(model(x)).backward()
    optim.step()
    optim.zero_grad(set_to_none=False)


def _unrecorded(step: Callable[[int], None]) -> Callable[[int], None]:
    """``step`` with the flight recorder hidden (as ``FERRODIST_FLIGHT_RECORDER=0`` leaves it)."""
    from ferrodist.debug import _recorder

    def run(round_: int) -> None:
        saved = _recorder.recorder()
        _recorder._State.recorder = None
        try:
            step(round_)
        finally:
            _recorder._State.recorder = saved

    return run


def measure(name: str, args: argparse.Namespace) -> list[tuple[str, str, dict[str, float]]]:
    rows = []
    _, block, _ = build(name, args.quick)
    for variant, impls in variants(block).items():
        steppers = {}
        for kind, wrap in impls.items():
            model, _, data = build(name, args.quick, "cuda")
            wrapped = wrap(model)
            optim = torch.optim.Adam(wrapped.parameters(), lr=1e-4)
            steppers[kind] = functools.partial(_step, wrapped, optim, data)
        # the same ferrodist model, stepped with the flight recorder off: what recording costs
        steppers["ferrodist unrecorded"] = _unrecorded(steppers["ferrodist"])
        times: dict[str, list[float]] = {kind: [] for kind in steppers}
        for round_ in range(args.warmup + args.steps):
            for kind in sorted(steppers, reverse=bool(round_ % 2)):
                torch.cuda.synchronize()
                start = time.perf_counter()
                steppers[kind](round_)
                torch.cuda.synchronize()
                if round_ >= args.warmup:
                    times[kind].append(time.perf_counter() - start)
        rows.append((name, variant, {k: statistics.median(v) for k, v in times.items()}))
        del steppers
        torch.cuda.empty_cache()
    return rows


def profile(args: argparse.Namespace) -> None:
    """Where a DDP step's time goes: torch's profiler over ``args.steps`` steps of each DDP on
    the transformer, the ops with the most self CPU time, then those with the most CUDA time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    _, block, _ = build("transformer", args.quick)
    for kind, wrap in variants(block)["DDP"].items():
        model, _, data = build("transformer", args.quick, "cuda")
        wrapped = wrap(model)
        optim = torch.optim.Adam(wrapped.parameters(), lr=1e-4)
        for step in range(args.warmup):
            _step(wrapped, optim, data, step)
        torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with torch_profile(activities=activities) as prof:
            for step in range(args.steps):
                _step(wrapped, optim, data, step)
            torch.cuda.synchronize()
        averages = prof.key_averages()
        print(f"\n## DDP transformer, {kind}: {args.steps} steps, by self CPU time")
        print(averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        print(f"\n## DDP transformer, {kind}: by CUDA time")
        print(averages.table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))
        del wrapped, optim, model
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default="transformer,many-tensors")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--profile", action="store_true", help="profile the DDP transformer row instead"
    )
    args = parser.parse_args()
    if args.quick:
        args.warmup, args.steps = 1, 3
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, NCCL world 1")
    if args.profile:
        profile(args)
        dist.destroy_process_group()
        return
    print(
        "| model | variant | torch step | ferrodist step | ratio "
        "| ferrodist, recorder off | recording adds |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for model, variant, t in measure(name, args):
            off = t["ferrodist unrecorded"]
            print(
                f"| {model} | {variant} | {t['torch'] * 1e3:.2f} ms | "
                f"{t['ferrodist'] * 1e3:.2f} ms | {t['ferrodist'] / t['torch']:.2f}x | "
                f"{off * 1e3:.2f} ms | {(t['ferrodist'] / off - 1) * 100:+.1f} % |",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
