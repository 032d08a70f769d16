"""One rank of the world started by test_fsdp_overlap.py: optimizer overlap for FSDP.

Two copies of one model are wrapped in ferrodist's FSDP; one trains with Adam stepped after
backward, the other with the same Adam registered through torch's overlap API
(``_as_overlapped_optim(...).register_fsdp``) so each unit steps inside backward. After a
``no_sync`` accumulation step and three synchronised steps their full state dicts must be
bit-identical (and differ from the start). Prints ``RESULT name PASS|FAIL why`` per config.
"""

from __future__ import annotations

import copy
import functools
import sys

import torch
import torch.distributed as dist
from _scenario_world import run_scenarios
from torch.distributed.fsdp import ShardingStrategy, StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.algorithms._optimizer_overlap.optimizer_overlap import _as_overlapped_optim
from ferrodist.fsdp import FullyShardedDataParallel as FSDP

CONFIGS = {
    "full_shard_flat": (ShardingStrategy.FULL_SHARD, False),
    "full_shard_orig": (ShardingStrategy.FULL_SHARD, True),
    "shard_grad_op_flat": (ShardingStrategy.SHARD_GRAD_OP, False),
    "no_shard_orig": (ShardingStrategy.NO_SHARD, True),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 5), torch.nn.Linear(5, 3)
    )


def wrap(base: torch.nn.Module, strategy: ShardingStrategy, orig: bool) -> FSDP:
    return FSDP(
        copy.deepcopy(base),
        sharding_strategy=strategy,
        auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        use_orig_params=orig,
        device_id=torch.device("cpu"),
    )


def full_state(fsdp: FSDP) -> dict[str, torch.Tensor]:
    with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT):
        return {k: v.clone() for k, v in fsdp.state_dict().items()}


def run(strategy: ShardingStrategy, orig: bool) -> None:
    rank = dist.get_rank()
    base = model()
    plain, overlapped = wrap(base, strategy, orig), wrap(base, strategy, orig)
    opt = torch.optim.Adam(plain.parameters(), lr=0.05)
    _as_overlapped_optim(torch.optim.Adam, overlapped.parameters(), lr=0.05).register_fsdp(
        overlapped
    )
    before = full_state(plain)
    for step in range(4):
        g = torch.Generator().manual_seed(10 * step + rank)
        x = torch.randn(6, 7, generator=g)
        for fsdp in (plain, overlapped):
            if step == 0:  # accumulate locally first, then sync on the next backward
                with fsdp.no_sync():
                    fsdp(x).square().mean().backward()
            else:
                fsdp(x).square().mean().backward()
        if step > 0:
            opt.step()
            opt.zero_grad()
            overlapped.zero_grad()
    a, b = full_state(plain), full_state(overlapped)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs from stepping after backward"
    assert any(not torch.equal(a[k], before[k]) for k in a), "nothing was stepped"


def main(rank: int, world: int, port: int) -> None:
    scenarios = {name: functools.partial(run, *config) for name, config in CONFIGS.items()}
    run_scenarios(rank, world, port, scenarios)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
