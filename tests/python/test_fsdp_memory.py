"""``ferrodist.fsdp.estimate_memory`` against what torch's own FSDP holds on gloo.

One world per size (2 and 4 processes, forked) runs every configuration of
``_fsdp_memory_workers.CONFIGS``: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, and HYBRID_SHARD and
_HYBRID_SHARD_ZERO2 on a device mesh; flat and original parameters; no policy,
``ModuleWrapPolicy`` and a size-based callable policy; Adam, Adam with amsgrad, AdamW, SGD with
and without momentum; bf16 mixed precision; an ignored module. Each rank measures its parameter
shards, gradients, optimizer state and the unsharded parameters held between forward and
backward. The estimate, computed from a model on the ``meta`` device, must be within 1 % of every
measured figure on every rank (it is in fact exact).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from _fsdp_memory_workers import CONFIGS, estimate_for, make_net, run_world
from torch import nn
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import MemoryEstimate, estimate_memory


def _within_one_percent(estimated: int, measured: int) -> bool:
    return abs(estimated - measured) <= 0.01 * measured


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_estimate_matches_torch_fsdp_per_rank(world: int, tmp_path: Path) -> None:
    names = list(CONFIGS)
    mp.start_processes(
        run_world, args=(world, str(tmp_path), names), nprocs=world, join=True, start_method="fork"
    )
    for rank in range(world):
        measured = json.loads((tmp_path / f"measured-{world}-{rank}.json").read_text())
        for name in names:
            est: MemoryEstimate = estimate_for(name, world, rank, estimate_memory)
            got = measured[name]
            pairs = {
                "param": est.param_bytes,
                "grad": est.grad_bytes,
                "optimizer_state": est.optimizer_state_bytes,
                "forward_held": est.forward_held_bytes,
            }
            for field, estimated in pairs.items():
                assert _within_one_percent(estimated, got[field]), (
                    name,
                    rank,
                    field,
                    estimated,
                    got[field],
                )
            assert est.total_bytes == est.param_bytes + est.grad_bytes + est.optimizer_state_bytes


def test_no_allocation_on_meta_and_default_rank_is_the_largest() -> None:
    net = make_net("meta")
    est = estimate_memory(
        net,
        4,
        ShardingStrategy.FULL_SHARD,
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        use_orig_params=True,
    )
    per_rank = [
        estimate_memory(
            net, 4, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), use_orig_params=True, rank=r
        ).total_bytes
        for r in range(4)
    ]
    assert est.total_bytes == max(per_rank)
    assert all(p.is_meta for p in net.parameters())


def test_world_of_one_is_no_shard_as_torch_switches() -> None:
    net = make_net("meta")
    est = estimate_memory(net, 1, ShardingStrategy.FULL_SHARD, optimizer=None)
    numel = sum(p.numel() for p in net.parameters())
    assert est.sharding_strategy is ShardingStrategy.NO_SHARD
    assert est.param_bytes == numel * 4 == est.grad_bytes
    assert est.optimizer_state_bytes == 0


def test_hybrid_shards_within_the_intra_group() -> None:
    net = make_net("meta")
    hybrid = estimate_memory(net, 8, ShardingStrategy.HYBRID_SHARD, intra_size=2)
    full = estimate_memory(net, 2, ShardingStrategy.FULL_SHARD)
    assert (hybrid.param_bytes, hybrid.grad_bytes, hybrid.optimizer_state_bytes) == (
        full.param_bytes,
        full.grad_bytes,
        full.optimizer_state_bytes,
    )


def test_bad_arguments_are_named() -> None:
    net = make_net("meta")
    with pytest.raises(ValueError, match="world_size"):
        estimate_memory(net, 0)
    with pytest.raises(ValueError, match="intra_size"):
        estimate_memory(net, 4, ShardingStrategy.HYBRID_SHARD, intra_size=3)
    with pytest.raises(ValueError, match="intra_size"):
        estimate_memory(net, 4, ShardingStrategy.FULL_SHARD, intra_size=2)
    with pytest.raises(ValueError, match="rank"):
        estimate_memory(net, 4, rank=4)
    with pytest.raises(TypeError, match="model"):
        estimate_memory(object(), 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sharding_strategy"):
        estimate_memory(net, 2, "FULL_SHARD")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer"):
        estimate_memory(net, 2, optimizer=torch.nn.Linear)  # type: ignore[arg-type]
