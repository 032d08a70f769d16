"""DDP step time and communication hiding: ferrodist's DDP vs torch's, world 2 on gloo.

Two processes train the same ~50M-parameter MLP with torch's DDP and with ferrodist's, in
interleaved rounds so machine noise hits both alike. Besides the step time it measures, on the
same processes, a backward with no communication (compute only) and the all-reduce of the same
bytes with no backward (communication only, bucket by bucket as DDP sends them). Then

    hidden = (compute_only + comm_only - ddp_backward) / comm_only

is the share of the all-reduce time that each DDP hides behind backward (1.0: all of it).
The Logger's own figures (torch's definitions, both DDPs) are printed too: how long the
all-reduce was in flight while backward still computed, and how long it ran on after backward
(the exposed part); their ratio ``during / (during + after)`` is the Logger's hidden share.
Under CPU contention (2 shared cores) the timing-based estimate above can clip to 0.

``--shapes`` measures models with many parameter tensors instead (``N x Linear(w, w)``, two
tensors per layer), each with DDP's options in turn: the default, ``find_unused_parameters``,
``gradient_as_bucket_view`` and torch's ``allreduce_hook`` as a comm hook (each DDP gets its own
package's hook); ``zero_overlap`` (ZeRO with ``overlap_with_ddp`` stepped from
``hook_with_zero_step``) and ``optim_overlap`` (``_register_fused_optim``) on request. Both
DDPs take turns step by step on the same processes; the table gives the
median step time of each and their ratio (ferrodist / torch).

    ./scripts/bench benches/bench_ddp.py [--layers 8] [--width 2560] [--steps 6]
    ./scripts/bench benches/bench_ddp.py --shapes 100x256,500x32,2000x8,5000x8 \
        [--variants default,find_unused,bucket_view,comm_hook,zero_overlap,optim_overlap]
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import statistics
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ferrodist.nn import DistributedDataParallel as FerroDDP


def _model(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*blocks)


#: DDP constructor options (and comm hook) of each ``--variants`` name.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "find_unused": {"find_unused_parameters": True},
    "bucket_view": {"gradient_as_bucket_view": True},
    "comm_hook": {"comm_hook": True},
    "zero_overlap": {"overlap": "zero"},
    "optim_overlap": {"overlap": "optim"},
}
#: Measured unless ``--variants`` names others (the overlap ones step inside backward).
DEFAULT_VARIANTS = ("default", "find_unused", "bucket_view", "comm_hook")


def _timed(fn: Callable[[], Any]) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    base = _model(args.layers, args.width)
    x = torch.randn(args.batch, args.width)
    ddps = {"torch": TorchDDP(copy.deepcopy(base)), "ferrodist": FerroDDP(copy.deepcopy(base))}
    optims = {k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in ddps.items()}
    local = copy.deepcopy(base)
    times: dict[str, list[float]] = {k: [] for k in (*ddps, "torch bwd", "ferrodist bwd")}
    times.update({"compute only": [], "comm only": []})

    def step(kind: str) -> None:
        out = ddps[kind](x).square().mean()
        t0 = time.perf_counter()
        out.backward()
        times[f"{kind} bwd"].append(time.perf_counter() - t0)
        optims[kind].step()
        optims[kind].zero_grad()

    def compute_only() -> None:
        out = local(x).square().mean()
        t0 = time.perf_counter()
        out.backward()
        times["compute only"].append(time.perf_counter() - t0)
        local.zero_grad()

    buckets = [b.buffer.clone() for b in ddps["ferrodist"].reducer._buckets]

    def comm_only() -> None:
        works = [dist.all_reduce(b, async_op=True) for b in buckets]
        for w in works:
            assert w is not None
            w.wait()

    for round_ in range(args.warmup + args.steps):
        for kind in ("torch", "ferrodist"):
            elapsed = _timed(lambda kind=kind: step(kind))
            if round_ >= args.warmup:
                times[kind].append(elapsed)
        compute_only()
        comm = _timed(comm_only)
        if round_ >= args.warmup:
            times["comm only"].append(comm)
        else:
            times["compute only"].clear()
            times["torch bwd"].clear()
            times["ferrodist bwd"].clear()
        buckets = [b.buffer.clone() for b in ddps["ferrodist"].reducer._buckets]
    overlap = {}
    for k, d in ddps.items():
        data = d._get_ddp_logging_data()
        together = data.get("avg_backward_compute_comm_overlap_time", 0) / 1e9
        comm_time = data.get("avg_backward_comm_time", 0) / 1e9
        overlap[k] = (together, max(0.0, comm_time - together))
    params = sum(p.numel() for p in base.parameters())
    queue.put((rank, {k: statistics.median(v) for k, v in times.items()}, overlap, params))
    dist.destroy_process_group()


def _make_ddp(kind: str, model: torch.nn.Module, variant: str) -> torch.nn.Module:
    options = dict(VARIANTS[variant])
    hook = options.pop("comm_hook", False)
    options.pop("overlap", None)
    if kind == "torch":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

        ddp: Any = TorchDDP(model, **options)
    else:
        from ferrodist.algorithms.ddp_comm_hooks import default_hooks as hooks  # type: ignore

        ddp = FerroDDP(model, **options)
    if hook:
        ddp.register_comm_hook(None, hooks.allreduce_hook)
    return ddp


def _make_step(kind: str, ddp: Any, variant: str) -> Callable[[torch.Tensor], None]:
    """One training step of ``ddp``: forward, backward, and the optimizer where it runs.

    ``zero_overlap``: ZeroRedundancyOptimizer(overlap_with_ddp=True) stepped from
    ``hook_with_zero_step`` (torch allows its hook only on NCCL; the guard is lifted for the
    measurement, as the tests do). ``optim_overlap``: ``_register_fused_optim`` (SGD stepped
    from the comm hook). Both step inside backward, so there is no ``optimizer.step()``.
    """
    overlap = VARIANTS[variant].get("overlap")
    if overlap == "zero":
        if kind == "torch":
            import torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook as zero_hooks
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            from torch.distributed.optim import ZeroRedundancyOptimizer as Zero
        else:
            import ferrodist.algorithms.ddp_comm_hooks.ddp_zero_hook as zero_hooks  # type: ignore
            from ferrodist.algorithms.ddp_comm_hooks.default_hooks import (  # type: ignore
                allreduce_hook,
            )
            from ferrodist.optim import ZeroRedundancyOptimizer as Zero  # type: ignore
        zero = Zero(ddp.parameters(), torch.optim.SGD, overlap_with_ddp=True, lr=1e-4)
        real = zero_hooks.dist.get_backend
        zero_hooks.dist.get_backend = lambda *a, **k: "nccl"
        try:
            ddp.register_comm_hook(None, zero_hooks.hook_with_zero_step(allreduce_hook, ddp, zero))
        finally:
            zero_hooks.dist.get_backend = real
        return lambda x: ddp(x).square().mean().backward()
    if overlap == "optim":
        ddp._register_fused_optim(torch.optim.SGD, lr=1e-4)
        return lambda x: ddp(x).square().mean().backward()
    optim = torch.optim.SGD(ddp.parameters(), lr=1e-4)

    def step(x: torch.Tensor) -> None:
        ddp(x).square().mean().backward()
        optim.step()
        optim.zero_grad()

    return step


def _alternate_steps(
    steps: dict[str, Callable[[torch.Tensor], None]], x: torch.Tensor, args: argparse.Namespace
) -> dict[str, float]:
    """Median step time of each DDP, the two taking turns (who goes first alternates)."""
    times: dict[str, list[float]] = {k: [] for k in steps}
    for round_ in range(args.warmup + args.steps):
        order = ("torch", "ferrodist") if round_ % 2 else ("ferrodist", "torch")
        for kind in order:
            elapsed = _timed(lambda kind=kind: steps[kind](x))
            if round_ >= args.warmup:
                times[kind].append(elapsed)
    return {k: statistics.median(v) for k, v in times.items()}


def _shapes_worker(rank: int, world: int, port: int, args: argparse.Namespace, queue: Any) -> None:
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    rows = []
    for shape in args.shapes.split(","):
        layers, width = (int(v) for v in shape.split("x"))
        base = _model(layers, width)
        x = torch.randn(args.batch, width)
        tensors = sum(1 for _ in base.parameters())
        for variant in args.variants.split(","):
            steps = {
                k: _make_step(k, _make_ddp(k, copy.deepcopy(base), variant), variant)
                for k in ("torch", "ferrodist")
            }
            medians = _alternate_steps(steps, x, args)
            rows.append((f"{layers} x Linear({width}, {width})", tensors, variant, medians))
    queue.put((rank, rows))
    dist.destroy_process_group()


def _run_shapes(args: argparse.Namespace, port: int) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_shapes_worker, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join(timeout=60)
    print(
        f"\nDDP step time (fwd+bwd+sync+SGD), world 2, gloo, batch {args.batch}, median of "
        f"{args.steps} steps, both DDPs taking turns\n"
    )
    print("| model | parameter tensors | variant | torch DDP step | ferrodist DDP step | ratio |")
    print("|---|---|---|---|---|---|")
    for model, tensors, variant, t in results[0]:
        print(
            f"| {model} | {tensors:,} | {variant} | {t['torch'] * 1e3:.0f} ms | "
            f"{t['ferrodist'] * 1e3:.0f} ms | {t['ferrodist'] / t['torch']:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2560)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--shapes", default="", help="many-tensor models, e.g. 100x256,2000x8")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if args.shapes:
        _run_shapes(args, port)
        return
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (t, o, n)) for r, t, o, n in (queue.get() for _ in procs))
    for p in procs:
        p.join(timeout=60)
    t, overlap, params = results[0]
    comm, compute = t["comm only"], t["compute only"]

    def hidden(kind: str) -> float:
        return max(0.0, min(1.0, (compute + comm - t[f"{kind} bwd"]) / comm))

    def logged_hidden(kind: str) -> float:
        during, after = overlap[kind]
        return during / (during + after) if during + after else 0.0

    rows = [
        ("step time (fwd+bwd+sync+SGD), s", t["torch"], t["ferrodist"]),
        ("backward incl. all-reduce, s", t["torch bwd"], t["ferrodist bwd"]),
        ("all-reduce hidden, from timings (0..1)", hidden("torch"), hidden("ferrodist")),
        ("all-reduce hidden, Logger (0..1)", logged_hidden("torch"), logged_hidden("ferrodist")),
        ("comm running during backward (Logger), s", overlap["torch"][0], overlap["ferrodist"][0]),
        ("comm left after backward (Logger), s", overlap["torch"][1], overlap["ferrodist"][1]),
    ]
    print(
        f"\nDDP, world 2, gloo, {params / 1e6:.1f}M parameters, batch {args.batch}, "
        f"median of {args.steps} steps; compute-only backward {compute:.3f} s, "
        f"comm-only all-reduce {comm:.3f} s\n"
    )
    print("| figure | torch | ferrodist | ratio |")
    print("|---|---|---|---|")
    for name, ours_torch, ours in rows:
        ratio = f"{ours / ours_torch:.2f}x" if ours_torch else "n/a"
        print(f"| {name} | {ours_torch:.3f} | {ours:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
