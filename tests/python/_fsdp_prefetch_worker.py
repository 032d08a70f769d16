"""One rank of the world started by test_fsdp_prefetch.py: does FSDP gather a unit's parameters
before the unit before it has finished computing?

Four units, each a ``Block`` whose flat shard has its own size, so the flight recorder's
``fsdp.all_gather`` entries say which unit each gather was for. A marker inside each block (an
autograd function, identity both ways) notes, when the block's own compute begins (its backward)
or ends (its forward), which units' gathers have been issued so far in that pass. Prints
``RESULT name PASS|FAIL why`` per scenario.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Optional

import torch
import torch.distributed as dist
from _scenario_world import run_scenarios
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import ferrodist.debug
from ferrodist.fsdp import FullyShardedDataParallel as FSDP

UNITS = 4
WIDTH = 16

_seen: list[tuple[str, int, set[int]]] = []
"""(pass, block, units whose gather was issued in this pass so far), in the order noted."""
_pass_started_at_id = 0


def _gathered_units() -> set[int]:
    """Blocks whose all-gather the recorder saw since the pass began (told apart by size)."""
    rec = ferrodist.debug.recorder()
    assert rec is not None
    out = set()
    for entry in rec.entries():
        if entry["id"] > _pass_started_at_id and entry["op"] == "fsdp.all_gather":
            out.add(_SHARD_NUMEL_TO_BLOCK[entry["shapes"][0][0]])
    return out


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, block: int) -> torch.Tensor:
        ctx.block = block
        _seen.append(("forward", block, _gathered_units()))
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        _seen.append(("backward", ctx.block, _gathered_units()))
        return grad, None


class Block(torch.nn.Module):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
        self.linear = torch.nn.Linear(WIDTH, WIDTH)
        self.extra = torch.nn.Parameter(torch.zeros(2 * index + 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.linear(x)) + self.extra.sum()
        return _Mark.apply(y, self.index)  # type: ignore[no-any-return]


def _backward_ops(rec: Any) -> list[tuple[str, int]]:
    """(op, block) of the FSDP gathers and reductions of the last pass, in issue order."""
    world = dist.get_world_size()
    out = []
    for entry in rec.entries():
        if entry["id"] <= _pass_started_at_id:
            continue
        if entry["op"] == "fsdp.all_gather":
            out.append((entry["op"], _SHARD_NUMEL_TO_BLOCK[entry["shapes"][0][0]]))
        elif entry["op"] == "fsdp.reduce_scatter":
            shard = entry["shapes"][0][0] // world
            out.append((entry["op"], _SHARD_NUMEL_TO_BLOCK[shard]))
    return out


def _shard_numel(index: int, world: int) -> int:
    numel = WIDTH * WIDTH + WIDTH + 2 * index + 2
    return -(-numel // world)


_SHARD_NUMEL_TO_BLOCK: dict[int, int] = {}


def run(backward_prefetch: Optional[BackwardPrefetch], forward_prefetch: bool) -> None:
    global _pass_started_at_id
    world = dist.get_world_size()
    _SHARD_NUMEL_TO_BLOCK.clear()
    _SHARD_NUMEL_TO_BLOCK.update({_shard_numel(i, world): i for i in range(UNITS)})
    assert len(_SHARD_NUMEL_TO_BLOCK) == UNITS
    torch.manual_seed(0)
    model = FSDP(
        torch.nn.Sequential(*[Block(i) for i in range(UNITS)]),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        backward_prefetch=backward_prefetch,
        forward_prefetch=forward_prefetch,
        device_id=torch.device("cpu"),
    )
    rec = ferrodist.debug.recorder()
    assert rec is not None
    for step in range(2):  # the first step teaches the order, the second prefetches by it
        _seen.clear()
        _pass_started_at_id = rec.entries()[-1]["id"]
        out = model(torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(step)))
        forward_seen = list(_seen)
        _seen.clear()
        _pass_started_at_id = rec.entries()[-1]["id"]
        out.square().mean().backward()
        backward_seen = list(_seen)
    # backward: blocks 3, 2, 1, 0 in turn; when block k > 0 begins computing,
    # block k-1's gather has been issued (BACKWARD_PRE/POST) or not (None)
    assert [b for _, b, _ in backward_seen] == [3, 2, 1, 0], backward_seen
    early_back = [k for _, k, gathered in backward_seen if k > 0 and (k - 1) in gathered]
    # forward: when block k finishes computing, block k+1's gather has been issued or not
    early_fwd = [k for _, k, gathered in forward_seen if k < UNITS - 1 and (k + 1) in gathered]
    print(f"EARLY backward={early_back} forward={early_fwd}", flush=True)
    if backward_prefetch is BackwardPrefetch.BACKWARD_PRE:
        assert early_back == [3, 2, 1], backward_seen
    elif backward_prefetch is BackwardPrefetch.BACKWARD_POST:
        # issued once block k's gradient is complete, before its reduce-scatter: not yet when
        # block k begins computing, but ahead of the reduction
        assert early_back == [], backward_seen
        ops = _backward_ops(rec)
        for k in range(1, UNITS):
            assert ops.index(("fsdp.all_gather", k - 1)) < ops.index(("fsdp.reduce_scatter", k)), (
                ops
            )
    else:
        assert early_back == [], backward_seen
    assert early_fwd == ([0, 1, 2] if forward_prefetch else []), forward_seen


SCENARIOS = {
    "backward_pre": (BackwardPrefetch.BACKWARD_PRE, False),
    "backward_post": (BackwardPrefetch.BACKWARD_POST, False),
    "no_prefetch": (None, False),
    "forward_prefetch": (None, True),
}


def main(rank: int, world: int, port: int) -> None:
    scenarios = {name: functools.partial(run, *config) for name, config in SCENARIOS.items()}
    run_scenarios(rank, world, port, scenarios)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
