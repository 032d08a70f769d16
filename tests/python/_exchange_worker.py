"""One rank of the worlds started by test_exchange.py: the collectives ``ferrodist._exchange``
composes of receives and sends (FSDP's all-gather and reduce-scatter, ZeRO's parameter
broadcasts) against gloo's own, on real processes. Prints ``RESULT name PASS|FAIL why``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from _exchange_count import calls
from _scenario_world import run_scenarios

import ferrodist._exchange as exchange
from ferrodist.optim import ZeroRedundancyOptimizer


def _awkward(n: int, seed: int) -> torch.Tensor:
    """Values a sum would disturb: -0.0, NaN with a payload, infinities, subnormals."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g)
    t[:4] = torch.tensor([-0.0, float("inf"), float("-inf"), 1e-45])
    t.view(torch.int32)[4] = 0x7FC00123  # a quiet NaN whose payload must survive
    return t


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (a, b)


def collectives_equal_gloos() -> None:
    """All-gather, reduce-scatter rows and broadcasts: gloo's bits, sync and async, two
    exchanges in flight at once on one group, and on a subgroup whose ranks are not global."""
    me, world = dist.get_rank(), dist.get_world_size()
    groups: list[Any] = [None]
    if world >= 3:
        groups.append(dist.new_group([0, world - 1]))
    else:
        dist.new_group([0])  # every rank takes part in new_group
    for group in groups:
        if group is not None and me not in (0, world - 1):
            continue
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        shard = _awkward(37, seed=rank)
        ours, theirs = torch.empty(37 * size), torch.empty(37 * size)
        exchange.all_gather(ours, shard, group)
        dist.all_gather_into_tensor(theirs, shard, group=group)
        _same_bits(ours, theirs)
        # two in flight at once: a gather and a reduce-scatter, waited in the other order
        full = _awkward(5 * size, seed=100 + rank)
        rows = torch.empty_like(full)
        again = torch.empty(37 * size)
        gather = exchange.all_gather(again, shard, group, async_op=True)
        scatter = exchange.reduce_scatter_rows(rows, full, group, async_op=True)
        assert scatter is not None and gather is not None
        scatter.wait()
        gather.wait()
        assert gather.is_completed() and scatter.is_completed()
        _same_bits(again, theirs)
        sent = [torch.empty_like(full) for _ in range(size)]
        dist.all_gather(sent, full, group=group)
        expected = torch.stack([s.view(size, 5)[rank] for s in sent])
        _same_bits(rows.view(size, 5), expected)
        # broadcasts: tensors owned by different ranks, one exchange
        tensors = [_awkward(11 + i, seed=200 + i + 10 * rank) for i in range(2 * size)]
        owners = [i % size for i in range(len(tensors))]
        wanted = [t.clone() for t in tensors]
        for t, owner in zip(wanted, owners):
            src = owner if group is None else dist.get_global_rank(group, owner)
            dist.broadcast(t, src, group=group)
        exchange.broadcast_each(tensors, owners, group)
        for a, b in zip(tensors, wanted):
            _same_bits(a, b)


def zero_steps_by_exchange() -> None:
    """ZeRO's parameter broadcasts go by one exchange per step where ``chosen_for`` says so
    (at two ranks by default), with the parameters of gloo's broadcasts bit for bit."""

    def train(setting: str) -> list[torch.Tensor]:
        os.environ["FERRODIST_EXCHANGE"] = setting
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Linear(13, 3))
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(3):
            model(torch.randn(4, 7, generator=g)).square().mean().backward()
            for p in model.parameters():  # gradients differ by rank: the shards must move
                assert p.grad is not None
                dist.all_reduce(p.grad)
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    calls["exchange"] = 0
    gloo = train("0")
    assert calls["exchange"] == 0, calls
    composed = train("1")
    assert calls["exchange"] == 3, calls  # one per step
    default = train("")
    by_default = dist.get_world_size() == 2
    assert calls["exchange"] == (6 if by_default else 3), calls
    for a, b, c in zip(gloo, composed, default):
        _same_bits(a, b)
        _same_bits(a, c)


def main(rank: int, world: int, port: int) -> None:
    run_scenarios(
        rank,
        world,
        port,
        {
            "collectives": collectives_equal_gloos,
            "zero": zero_steps_by_exchange,
        },
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
