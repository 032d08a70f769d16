"""Worker functions for the FSDP tests, run in real processes on gloo (forked by the tests).

Every check runs torch's ``FullyShardedDataParallel`` and ferrodist's in the same processes, from
the same seed and the same per-rank batches, and asserts bit-identical losses, full state dicts
and optimizer states: torch's FSDP on CPU is the reference.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as TorchFSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import FullyShardedDataParallel as FerroFSDP

CPU = torch.device("cpu")
STEPS = 3


def init_world(rank: int, world: int, tmp: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore", FutureWarning)  # NO_SHARD's deprecation notice
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{world}", rank=rank, world_size=world
    )


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.inner = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.tanh(self.inner(x))) + x


def make_model(seed: int = 0) -> nn.Module:
    """Odd sizes, so shards split parameters and need end padding; a buffer too."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(7, 9),
        nn.BatchNorm1d(9),
        Block(9),
        Block(9),
        nn.Linear(9, 3),
    )


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(5, 7, generator=g), torch.randn(5, 3, generator=g)


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def train(model: nn.Module, optim: torch.optim.Optimizer, rank: int, steps: int) -> list[float]:
    losses = []
    for step in range(steps):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.detach())
    return losses


def assert_same_state(a: dict[str, Any], b: dict[str, Any], tag: str) -> None:
    assert list(a) == list(b), (tag, list(a), list(b))
    for key, value in a.items():
        assert torch.equal(value, b[key]), (tag, key, value, b[key])


def hybrid_groups(rank: int, world: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Shard within pairs of ranks, replicate across pairs (every rank creates every group)."""
    shard_size = 2 if world % 2 == 0 and world > 2 else world
    intra = None
    inter = None
    for start in range(0, world, shard_size):
        group = dist.new_group(list(range(start, start + shard_size)))
        if start <= rank < start + shard_size:
            intra = group
    for offset in range(shard_size):
        group = dist.new_group(list(range(offset, world, shard_size)))
        if rank % shard_size == offset:
            inter = group
    assert intra is not None and inter is not None
    return intra, inter


def wrap_both(
    strategy: ShardingStrategy,
    use_orig_params: bool,
    policy: bool,
    groups: Optional[Any],
) -> tuple[nn.Module, nn.Module]:
    kwargs: dict[str, Any] = dict(
        sharding_strategy=strategy, use_orig_params=use_orig_params, device_id=CPU
    )
    if groups is not None:
        kwargs["process_group"] = groups
    if policy:
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({Block, nn.Linear})
    theirs = TorchFSDP(make_model(), **kwargs)
    ours = FerroFSDP(make_model(), **kwargs)
    return theirs, ours


def check_parity(rank: int, world: int, configs: list[tuple[str, bool, bool, str]]) -> None:
    """For each (strategy, use_orig_params, policy, optimizer): torch == ferrodist, bitwise."""
    groups = None
    for strategy_name, use_orig_params, policy, optim_name in configs:
        strategy = ShardingStrategy[strategy_name]
        if strategy_name.startswith("HYBRID") or strategy_name == "_HYBRID_SHARD_ZERO2":
            groups = groups or hybrid_groups(rank, world)
            pg: Optional[Any] = groups
        else:
            pg = None
        tag = f"{strategy_name} orig={use_orig_params} policy={policy} {optim_name} w{world}"
        theirs, ours = wrap_both(strategy, use_orig_params, policy, pg)
        assert [n for n, _ in theirs.named_parameters()] == [
            n for n, _ in ours.named_parameters()
        ], tag
        assert [n for n, _ in theirs.named_buffers()] == [n for n, _ in ours.named_buffers()], tag
        for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
            assert p.shape == q.shape and torch.equal(p, q), (tag, name)
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag + " initial")
        make_optim = OPTIMIZERS[optim_name]
        theirs_optim = make_optim(theirs.parameters())
        ours_optim = make_optim(ours.parameters())
        theirs_losses = train(theirs, theirs_optim, rank, STEPS)
        ours_losses = train(ours, ours_optim, rank, STEPS)
        for step, (a, b) in enumerate(zip(theirs_losses, ours_losses)):
            assert torch.equal(a, b), (tag, step, a.item(), b.item())
        assert_same_state(theirs.state_dict(), ours.state_dict(), tag)
        for (name, p), (_, q) in zip(theirs.named_parameters(), ours.named_parameters()):
            assert torch.equal(p, q), (tag, name)
        theirs_state = theirs_optim.state_dict()["state"]
        ours_state = ours_optim.state_dict()["state"]
        assert sorted(theirs_state) == sorted(ours_state), tag
        for index, entry in theirs_state.items():
            for key, value in entry.items():
                assert torch.equal(value, ours_state[index][key]), (tag, index, key)
    dist.barrier()


PARITY_W2: list[tuple[str, bool, bool, str]] = [
    ("FULL_SHARD", False, False, "sgd"),
    ("FULL_SHARD", True, True, "adam"),
    ("FULL_SHARD", False, True, "adam"),
    ("SHARD_GRAD_OP", False, True, "sgd"),
    ("SHARD_GRAD_OP", True, False, "adam"),
    ("NO_SHARD", False, True, "adam"),
    ("NO_SHARD", True, True, "sgd"),
    ("HYBRID_SHARD", False, True, "adam"),
    ("_HYBRID_SHARD_ZERO2", True, True, "sgd"),
]

PARITY_W4: list[tuple[str, bool, bool, str]] = [
    ("FULL_SHARD", True, True, "adam"),
    ("HYBRID_SHARD", False, True, "sgd"),
]


def run_world(rank: int, world: int, tmp: str) -> None:
    init_world(rank, world, tmp)
    try:
        check_parity(rank, world, PARITY_W2 if world == 2 else PARITY_W4)
    finally:
        dist.destroy_process_group()
