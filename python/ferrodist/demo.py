"""The demo: real processes train a small model with DDP over gloo on CPU, via ferrodist.

``python -m ferrodist.demo [--world-size N] [--steps S] [--optimizer NAME] [--ddp NAME]
[--fsdp STRATEGY]`` (``--fsdp`` trains with ferrodist's FullyShardedDataParallel instead of DDP)
(``./scripts/demo`` runs it). The launcher starts N processes; each does
``import ferrodist as dist`` and rendezvouses over ``tcp://`` with the store server embedded in
rank 0 (no separate server to start). Rank 0 prints who joined and then the loss, averaged over
all ranks, as it falls.

The optimizer and the DDP wrapper are chosen from tables (``OPTIMIZERS``, ``DDP_WRAPPERS``): each
entry imports what it needs only when picked, so an entry for a component that another part
of ferrodist provides (``ferrodist.optim.ZeroRedundancyOptimizer``, ``ferrodist.nn``'s DDP) is
one line added here, and the flags' choices follow the tables.
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import torch

__all__ = ["DDP_WRAPPERS", "OPTIMIZERS", "main"]


def _attr(module: str, name: str) -> Any:
    """``module.name``, imported when first needed (so an absent extra never breaks startup)."""
    return getattr(importlib.import_module(module), name)


OPTIMIZERS: dict[str, Callable[[Any, float], torch.optim.Optimizer]] = {
    "sgd": lambda params, lr: _attr("torch.optim", "SGD")(params, lr=lr, momentum=0.9),
    "adam": lambda params, lr: _attr("torch.optim", "Adam")(params, lr=lr),
    "zero": lambda params, lr: _attr("ferrodist.optim", "ZeroRedundancyOptimizer")(
        params, optimizer_class=_attr("torch.optim", "SGD"), lr=lr, momentum=0.9
    ),
}
"""``--optimizer`` choices: name -> build(parameters, lr)."""

DDP_WRAPPERS: dict[str, Callable[[torch.nn.Module], torch.nn.Module]] = {
    "ferrodist": lambda model: _attr("ferrodist.nn", "DistributedDataParallel")(model),
    "torch": lambda model: _attr("torch.nn.parallel", "DistributedDataParallel")(model),
}
"""``--ddp`` choices: name -> wrap(model)."""

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
"""``--fsdp`` choices: torch's ``ShardingStrategy`` names that need no extra process groups."""


def _wrap_fsdp(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    import torch

    fsdp = importlib.import_module("ferrodist.fsdp")
    return fsdp.FullyShardedDataParallel(  # type: ignore[no-any-return]
        model,
        sharding_strategy=fsdp.ShardingStrategy[strategy],
        device_id=torch.device("cpu"),
        use_orig_params=True,
    )


DEFAULT_LR = {"sgd": 0.05, "adam": 0.01, "zero": 0.05}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ferrodist.demo", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="processes to start (default 2)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default 60)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    p.add_argument("--ddp", choices=sorted(DDP_WRAPPERS), default="ferrodist")
    p.add_argument(
        "--fsdp",
        choices=FSDP_STRATEGIES,
        default=None,
        help="wrap with ferrodist's FullyShardedDataParallel and this sharding strategy",
    )
    p.add_argument("--lr", type=float, default=None, help="learning rate (default per optimizer)")
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # set for children
    args = p.parse_args(argv)
    if args.world_size < 1 or args.steps < 1:
        p.error("--world-size and --steps must be at least 1")
    if args.fsdp and args.optimizer == "zero":
        p.error("--fsdp already shards the optimizer state: use --optimizer sgd or adam")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _data(rank: int, n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard of a fixed regression problem: y = sin(x @ w) + noise."""
    import torch

    w = torch.linspace(-1.0, 1.0, 8).unsqueeze(1)
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(n, 8, generator=g)
    return x, torch.sin(x @ w) + 0.01 * torch.randn(n, 1, generator=g)


def _worker(rank: int, args: argparse.Namespace, port: int) -> None:
    import torch

    import ferrodist as dist

    torch.set_num_threads(1)
    url = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=args.world_size)
    joined: list[Any] = [None] * args.world_size
    dist.all_gather_object(joined, (rank, socket.gethostname(), os.getpid()))
    if rank == 0:
        print(f"rendezvous over {url} (store embedded in rank 0): {args.world_size} joined")
        for r, host, pid in joined:
            print(f"  rank {r}: pid {pid} on {host}")
        wrapper = f"--fsdp {args.fsdp}" if args.fsdp else f"--ddp {args.ddp}"
        print(f"training with {wrapper} --optimizer {args.optimizer}", flush=True)

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    ddp = _wrap_fsdp(model, args.fsdp) if args.fsdp else DDP_WRAPPERS[args.ddp](model)
    lr = args.lr if args.lr is not None else DEFAULT_LR.get(args.optimizer, 0.01)
    opt = OPTIMIZERS[args.optimizer](ddp.parameters(), lr)
    x, y = _data(rank)
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            # SUM then divide: gloo in torch 2.4 has no AVG.
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            mean /= dist.get_world_size()
            if rank == 0:
                print(f"step {step:4d}  loss {mean.item():.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Start the processes (or, with the hidden ``--rank``, be one), return an exit status."""
    args = _parse(argv)
    port = args.port or _free_port()
    if args.rank is not None:
        _worker(args.rank, args, port)
        return 0
    print(f"ferrodist demo: {args.world_size} processes, {args.steps} steps", flush=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "ferrodist.demo", *argv, "--port", str(port), "--rank", str(r)]
        )
        for r in range(args.world_size)
    ]
    try:
        while True:
            codes = [c.poll() for c in children]
            failed = [r for r, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                print(f"ferrodist demo: rank(s) {failed} failed; stopping the others", flush=True)
                return 1
            if all(code == 0 for code in codes):
                return 0
            time.sleep(0.1)
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()


if __name__ == "__main__":
    sys.exit(main())
