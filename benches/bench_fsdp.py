"""FSDP: ferrodist's ``FullyShardedDataParallel`` vs torch's, world 2 on gloo (CPU).

Two models, each wrapped per block with torch's ``ModuleWrapPolicy`` and trained with Adam:

* ``transformer``: a GPT-like stack (token embedding, pre-norm blocks of attention + MLP,
  LayerNorm, tied-free output head), about 50M parameters;
* ``many-tensors``: 100 blocks of 10 x Linear(16, 16): 2,000 parameter tensors in 100 units.

For each model and sharding strategy it reports:

* step time (forward, backward, optimizer step), both implementations in the same processes,
  taking turns step by step (who goes first alternates), median of the timed steps;
* peak resident memory per rank (VmHWM) over a training run, each implementation in fresh
  processes so neither inherits the other's heap;
* parameter + gradient + optimizer-state bytes each rank holds, against 1/W of the unsharded
  model's (the target for FULL_SHARD: within 1 %).

Prints markdown tables; ratio = ferrodist / torch (lower is better).
Run: ``./scripts/bench benches/bench_fsdp.py`` (``--quick``: small models, few steps;
``--strategies FULL_SHARD,SHARD_GRAD_OP``; ``--models transformer``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class SmallBlock(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth // 2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layers(x))


class ManyTensors(nn.Module):
    def __init__(self, blocks: int, width: int, tensors_per_block: int) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[SmallBlock(width, tensors_per_block) for _ in range(blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def build(
    name: str, quick: bool, device: str = "cpu"
) -> tuple[nn.Module, type[nn.Module], Callable[[int], Any]]:
    """(model, the block class to wrap, batch(step) -> (input, loss_fn)), batches on
    ``device``."""
    torch.manual_seed(0)
    if name == "transformer":
        vocab, dim, layers, heads, seq, batch = (
            (512, 128, 2, 4, 32, 4) if quick else (8192, 768, 6, 12, 64, 4)
        )
        model: nn.Module = Transformer(vocab, dim, layers, heads)

        def data(step: int) -> Any:
            g = torch.Generator().manual_seed(step)
            tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
            return tokens[:, :-1], lambda out: nn.functional.cross_entropy(
                out.reshape(-1, vocab), tokens[:, 1:].reshape(-1)
            )

        return model, Block, data
    blocks = 10 if quick else 100
    model = ManyTensors(blocks, 16, 20)

    def data(step: int) -> Any:
        x = torch.randn(32, 16, generator=torch.Generator().manual_seed(step)).to(device)
        return x, lambda out: out.square().mean()

    return model, SmallBlock, data


def implementations() -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP

    impls: dict[str, Any] = {"torch": TorchFSDP}
    try:
        from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP

        impls["ferrodist"] = FerroFSDP
    except ImportError:
        print("ferrodist.fsdp is not available: measuring torch only")
    return impls


def wrap(impl: Any, model: nn.Module, block: type[nn.Module], strategy: str) -> nn.Module:
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return impl(  # type: ignore[no-any-return]
        model,
        auto_wrap_policy=ModuleWrapPolicy({block}),
        sharding_strategy=getattr(ShardingStrategy, strategy),
        device_id=torch.device("cpu"),
    )


def init(rank: int, tmp: str, tag: str, threads: int) -> None:
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # deep MLPs decay into subnormals: benches/README.md
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{tag}", rank=rank, world_size=WORLD
    )


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    return 0


def held_bytes(model: nn.Module, optim: torch.optim.Optimizer) -> int:
    """Parameter + gradient + optimizer-state bytes this rank holds (shards, padding included)."""
    params = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    total += sum(tensor_bytes(s) for s in optim.state.values())
    return total


def timing_worker(rank: int, tmp: str, args: argparse.Namespace, queue: Any) -> None:
    init(rank, tmp, "timing", args.threads)
    impls = implementations()
    rows = []
    for name in args.models.split(","):
        for strategy in args.strategies.split(","):
            steppers = {}
            for kind, impl in impls.items():
                model, block, data = build(name, args.quick)
                fsdp = wrap(impl, model, block, strategy)
                optim = torch.optim.Adam(fsdp.parameters(), lr=1e-4)
                steppers[kind] = functools.partial(_step, fsdp, optim, data)
            times: dict[str, list[float]] = {k: [] for k in steppers}
            for round_ in range(args.warmup + args.steps):
                order = sorted(steppers, reverse=bool(round_ % 2))
                for kind in order:
                    dist.barrier()
                    start = time.perf_counter()
                    steppers[kind](round_)
                    if round_ >= args.warmup:
                        times[kind].append(time.perf_counter() - start)
            rows.append((name, strategy, {k: statistics.median(v) for k, v in times.items()}))
    queue.put((rank, rows))
    dist.destroy_process_group()


def _step(fsdp: nn.Module, optim: torch.optim.Optimizer, data: Any, step: int) -> None:
    x, loss_fn = data(step)
    loss_fn(fsdp(x)).backward()
    optim.step()
    optim.zero_grad(set_to_none=False)


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def memory_worker(
    rank: int, tmp: str, args: argparse.Namespace, kind: str, name: str, strategy: str, queue: Any
) -> None:
    init(rank, tmp, f"mem-{kind}-{name}-{strategy}", args.threads)
    impl = implementations()[kind]
    model, block, data = build(name, args.quick)
    unsharded = sum(p.numel() * p.element_size() for p in model.parameters())
    fsdp = wrap(impl, model, block, strategy)
    optim = torch.optim.Adam(fsdp.parameters(), lr=1e-4)
    for step in range(args.memory_steps):
        _step(fsdp, optim, data, step)
    queue.put(
        (rank, {"hwm_kib": _vm_hwm_kib(), "held": held_bytes(fsdp, optim), "full": unsharded})
    )
    dist.destroy_process_group()


def spawn(target: Any, *args: Any) -> dict[int, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=target, args=(r, tmp, *args, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        out = dict(queue.get() for _ in procs)
        for p in procs:
            p.join(timeout=120)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default="transformer,many-tensors")
    parser.add_argument("--strategies", default="FULL_SHARD,SHARD_GRAD_OP")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // WORLD))
    parser.add_argument("--timing-only", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup = 3, 1

    timing = spawn(timing_worker, args)[0]
    print(f"\nFSDP step time (fwd+bwd+Adam), world {WORLD}, gloo, median of {args.steps} steps\n")
    print("| model | strategy | torch | ferrodist | ratio |")
    print("|---|---|---|---|---|")
    for name, strategy, t in timing:
        ours = t.get("ferrodist")
        ratio = f"{ours / t['torch']:.2f}x" if ours else "-"
        cell = f"{ours * 1e3:.0f} ms" if ours else "-"
        print(f"| {name} | {strategy} | {t['torch'] * 1e3:.0f} ms | {cell} | {ratio} |")
    if args.timing_only:
        return

    print(
        f"\nMemory per rank after {args.memory_steps} steps (fresh processes per implementation)\n"
    )
    print("| model | strategy | impl | peak RSS (max rank) | params+grads+Adam state | vs 1/W |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for strategy in args.strategies.split(","):
            for kind in implementations():
                res = spawn(memory_worker, args, kind, name, strategy)
                hwm = max(r["hwm_kib"] for r in res.values()) / 1024
                held = max(r["held"] for r in res.values())
                ideal = res[0]["full"] * 4 / WORLD  # param + grad + exp_avg + exp_avg_sq
                print(
                    f"| {name} | {strategy} | {kind} | {hwm:.0f} MiB | {held / 2**20:.1f} MiB | "
                    f"{held / ideal:.3f}x |"
                )


if __name__ == "__main__":
    main()
