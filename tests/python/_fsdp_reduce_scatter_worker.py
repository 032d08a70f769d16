"""One rank of the worlds started by test_fsdp_reduce_scatter.py: FSDP's all-gather and
reduce-scatter on gloo composed of receives and sends posted first, and a local sum in rank
order for the reduce-scatter (see ``ferrodist._exchange``).

The same model trains one step with the composed path and with gloo's own collectives
(``FERRODIST_EXCHANGE`` set per run); the composed path must really be taken (its
exchanges are counted), and its parameters and gradients must equal gloo's: bit for bit at two
ranks, to rounding at three (the gathered parameters bit for bit at any size). Prints
``RESULT name PASS|FAIL why``.
"""

from __future__ import annotations

import copy
import functools
import os
import sys

import torch
import torch.distributed as dist
from _exchange_count import calls
from _scenario_world import run_scenarios
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from ferrodist.fsdp import FullyShardedDataParallel as FSDP


def _grads(base: torch.nn.Module, setting: str) -> list[torch.Tensor]:
    os.environ["FERRODIST_EXCHANGE"] = setting
    model = FSDP(copy.deepcopy(base), auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}))
    g = torch.Generator().manual_seed(dist.get_rank())
    model(torch.randn(5, 9, generator=g)).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    with FSDP.summon_full_params(model):  # an all-gather per unit
        full = [p.detach().clone() for p in model.parameters()]
    return grads + full


def run(composed_by_default: bool) -> None:
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(9, 31), torch.nn.Tanh(), torch.nn.Linear(31, 3))
    calls["exchange"] = 0
    gloo = _grads(base, "0")
    assert calls["exchange"] == 0, calls
    composed = _grads(base, "1")
    # per unit: a gather in forward and in backward, a reduce-scatter, a gather to summon
    assert calls["exchange"] >= 8, calls
    taken = calls["exchange"]
    default = _grads(base, "")
    assert (calls["exchange"] >= 2 * taken) == composed_by_default, calls
    exact = dist.get_world_size() == 2
    for a, b in zip(gloo, composed):
        if exact:
            assert torch.equal(a, b), (a - b).abs().max()
        else:
            torch.testing.assert_close(a, b)
    for a, b in zip(gloo if not composed_by_default else composed, default):
        assert torch.equal(a, b)


def main(rank: int, world: int, port: int) -> None:
    run_scenarios(rank, world, port, {"composed": functools.partial(run, world == 2)})


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
