"""Worker for the FSDP memory-estimate test: torch's own FSDP on gloo, measured per rank.

Each rank trains every configuration for two Adam-style steps and records what torch holds:
the flat parameters' local shards, their gradients after backward, the optimizer state after
the step, and the unsharded parameters still allocated between forward and backward. Every
number comes from torch's tensors (``numel * element_size`` of what is allocated), never from
ferrodist's plan.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _world_end import end_world
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(13, 29)
        self.norm = nn.LayerNorm(29)
        self.down = nn.Linear(29, 11)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.norm(self.up(x))))


class Net(nn.Module):
    """Uneven sizes so that shard, alignment and world padding all show up."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(7, 13)
        self.blocks = nn.Sequential(Block(), nn.Linear(11, 13), Block())
        self.head = nn.Linear(11, 3, bias=False)
        self.scale = nn.Parameter(torch.ones(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x))) * self.scale[:3]


def make_net(device: str = "cpu") -> Net:
    torch.manual_seed(0)
    with torch.device(device):
        return Net()


def _size_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    return size_based_auto_wrap_policy(module, recurse, nonwrapped_numel, min_num_params=300)


def _custom_wrap(module: nn.Module) -> bool | dict[str, Any]:
    if isinstance(module, Block):
        return {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP, "mixed_precision": None}
    return isinstance(module, nn.Linear)


# name -> FSDP kwargs, optimizer (class, kwargs), estimate extras
CONFIGS: dict[str, dict[str, Any]] = {
    "full_shard_no_policy": dict(strategy=ShardingStrategy.FULL_SHARD, policy=None, uop=False),
    "full_shard_linear_policy": dict(
        strategy=ShardingStrategy.FULL_SHARD, policy=ModuleWrapPolicy({nn.Linear}), uop=False
    ),
    "full_shard_orig_params_ignored": dict(
        strategy=ShardingStrategy.FULL_SHARD,
        policy=ModuleWrapPolicy({Block}),
        uop=True,
        ignored="head",
    ),
    "shard_grad_op_amsgrad": dict(
        strategy=ShardingStrategy.SHARD_GRAD_OP,
        policy=ModuleWrapPolicy({Block}),
        uop=True,
        optim=(torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    ),
    "shard_grad_op_flat": dict(
        strategy=ShardingStrategy.SHARD_GRAD_OP, policy=ModuleWrapPolicy({nn.Linear}), uop=False
    ),
    "no_shard_sgd_momentum": dict(
        strategy=ShardingStrategy.NO_SHARD,
        policy=ModuleWrapPolicy({nn.Linear}),
        uop=True,
        optim=(torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}),
    ),
    "no_shard_flat": dict(strategy=ShardingStrategy.NO_SHARD, policy=None, uop=False),
    "size_policy_adamw": dict(
        strategy=ShardingStrategy.FULL_SHARD,
        policy=_size_policy,
        uop=True,
        optim=(torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    ),
    "mixed_precision_bf16": dict(
        strategy=ShardingStrategy.FULL_SHARD,
        policy=ModuleWrapPolicy({Block, nn.Linear}),
        uop=True,
        mp=MixedPrecision(param_dtype=torch.bfloat16),
    ),
    # Sharded within groups of 2 ranks, replicated across them (a (world / 2, 2) device mesh).
    "hybrid_shard": dict(
        strategy=ShardingStrategy.HYBRID_SHARD,
        policy=ModuleWrapPolicy({nn.Linear}),
        uop=False,
        intra_size=2,
    ),
    "hybrid_zero2_orig_params": dict(
        strategy=ShardingStrategy._HYBRID_SHARD_ZERO2,
        policy=ModuleWrapPolicy({Block}),
        uop=True,
        intra_size=2,
    ),
    # Blocks kept unsharded after forward (SHARD_GRAD_OP) and in full precision, the rest
    # FULL_SHARD in bf16: per-module settings from a CustomPolicy.
    "custom_policy_overrides": dict(
        strategy=ShardingStrategy.FULL_SHARD,
        policy=CustomPolicy(_custom_wrap),
        uop=True,
        mp=MixedPrecision(param_dtype=torch.bfloat16),
    ),
    "sgd_plain": dict(
        strategy=ShardingStrategy.SHARD_GRAD_OP,
        policy=ModuleWrapPolicy({nn.Linear}),
        uop=False,
        optim=(torch.optim.SGD, {"lr": 0.01}),
    ),
}


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _handles(model: nn.Module) -> list[Any]:
    return [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]


def measure(rank: int, name: str, config: dict[str, Any]) -> dict[str, int]:
    net = make_net()
    ignored = [getattr(net, config["ignored"])] if "ignored" in config else None
    extra: dict[str, Any] = {}
    if "intra_size" in config:
        world = dist.get_world_size()
        extra["device_mesh"] = init_device_mesh(
            "cpu", (world // config["intra_size"], config["intra_size"])
        )
    model = FSDP(
        net,
        **extra,
        device_id=torch.device("cpu"),
        sharding_strategy=config["strategy"],
        auto_wrap_policy=config["policy"],
        use_orig_params=config["uop"],
        mixed_precision=config.get("mp"),
        ignored_modules=ignored,
    )
    cls, kwargs = config.get("optim", (torch.optim.Adam, {"lr": 0.01}))
    opt = cls(model.parameters(), **kwargs)
    out: dict[str, int] = {}
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = model(torch.randn(4, 7, generator=g)).square().sum()
        out["forward_held"] = sum(
            h.flat_param._full_param_padded.untyped_storage().nbytes()
            for h in _handles(model)
            if hasattr(h.flat_param, "_full_param_padded")
        )
        loss.backward()
        out["grad"] = sum(_nbytes(h.flat_param.grad) for h in _handles(model))
        # Ignored modules keep plain, replicated parameters and gradients on every rank.
        out["grad"] += sum(_nbytes(p.grad) for m in ignored or [] for p in m.parameters())
        opt.step()
    out["param"] = sum(_nbytes(h.flat_param._local_shard) for h in _handles(model))
    out["param"] += sum(_nbytes(p) for m in ignored or [] for p in m.parameters())
    out["optimizer_state"] = sum(
        _nbytes(v) for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )
    return out


def run_world(rank: int, world: int, tmp: str, names: list[str]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.filterwarnings("ignore")  # NO_SHARD's deprecation, FSDP1's deprecation
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp}/pg-{world}", rank=rank, world_size=world
    )
    try:
        results = {name: measure(rank, name, CONFIGS[name]) for name in names}
    finally:
        end_world()
    Path(tmp, f"measured-{world}-{rank}.json").write_text(json.dumps(results))


def estimate_for(name: str, world: int, rank: int, estimate: Callable[..., Any]) -> Any:
    config = CONFIGS[name]
    net = make_net("meta")
    ignored = [getattr(net, config["ignored"])] if "ignored" in config else None
    cls, kwargs = config.get("optim", (torch.optim.Adam, {"lr": 0.01}))
    optimizer = cls if not kwargs.keys() - {"lr"} else cls([nn.Parameter(torch.zeros(1))], **kwargs)
    return estimate(
        net,
        world,
        config["strategy"],
        config.get("mp"),
        optimizer,
        auto_wrap_policy=config["policy"],
        use_orig_params=config["uop"],
        ignored_modules=ignored,
        intra_size=config.get("intra_size"),
        rank=rank,
    )
