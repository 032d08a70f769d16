"""In-process checks of the optim API surface: argument errors match torch's, the module is a
drop-in for ``torch.distributed.optim``, ShardedOptimizer state dicts and the overlap registry.
(Multi-process behaviour is in test_zero.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.distributed.optim as torch_optim
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

import ferrodist.optim as fopt
from ferrodist import _native


def test_optim_exports_everything_torch_distributed_optim_exports() -> None:
    for name in torch_optim.__all__:
        if name == "DistributedOptimizer" and not hasattr(torch._C, "_rpc_init"):
            continue
        assert hasattr(fopt, name), name
    assert fopt.as_functional_optim is torch_optim.as_functional_optim


BAD_PARAMS: list[Any] = [
    torch.zeros(2),
    1.2,
    [],
    [torch.zeros(2), 42],
    [{"lr": 0.1}],
    [torch.zeros(2), torch.zeros(2, dtype=torch.float64)],
]


@pytest.mark.parametrize("params", BAD_PARAMS, ids=range(len(BAD_PARAMS)))
def test_bad_params_raise_like_torch(params: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as theirs:
        TorchZero(params, torch.optim.SGD, lr=0.1)
    with pytest.raises(theirs.type) as ours:
        fopt.ZeroRedundancyOptimizer(params, torch.optim.SGD, lr=0.1)
    assert str(ours.value) == str(theirs.value)


def test_native_partition_matches_torch_documented_cases() -> None:
    # Two groups sharing the per-rank sizes: {[4, 4]}, {[4, 4, 10]} on 2 ranks.
    assert _native.sorted_greedy_partition([[4, 4], [4, 4, 10]], 2) == [
        [[0], [1]],
        [[2], [0, 1]],
    ]
    with pytest.raises(ValueError):
        _native.sorted_greedy_partition([[1]], 0)


def test_sharded_optimizer_state_dict_round_trip_and_add_param_group() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    opt_a = fopt.ShardedOptimizer(dict(a.named_parameters()), torch.optim.Adam, lr=0.1)
    x = torch.randn(4, 3)
    a(x).sum().backward()
    opt_a.step()
    saved = opt_a.state_dict()
    assert set(saved["state"]) == {"weight", "bias"}
    # Registration order differs; names line the state up anyway.
    opt_b = fopt.ShardedOptimizer({"bias": b.bias, "weight": b.weight}, torch.optim.Adam, lr=0.1)
    with torch.no_grad():
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)
    opt_b.load_state_dict(copy.deepcopy(saved))  # as if read back from a file
    for model, opt in ((a, opt_a), (b, opt_b)):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    extra = nn.Parameter(torch.ones(2))
    opt_b.add_param_group({"params": {"extra": extra}, "lr": 0.5})
    (extra * 2).sum().backward()
    opt_b.step()
    assert not torch.equal(extra, torch.ones(2))
    with pytest.raises(TypeError, match="must map parameter names"):
        opt_b.add_param_group({"params": [nn.Parameter(torch.ones(1))]})
    with pytest.raises(ValueError, match="already"):
        opt_b.add_param_group({"params": {"extra": nn.Parameter(torch.ones(1))}})


def test_overlap_registry() -> None:
    class MyOverlapped(fopt.OverlappedOptimizer):
        def register_ddp(self, ddp: Any) -> None:
            pass

        def register_fsdp(self, fsdp: Any) -> None:
            pass

    class MySGD(torch.optim.SGD):
        pass

    def make(optim_cls: type, params: Any, *args: Any, **kwargs: Any) -> MyOverlapped:
        return MyOverlapped(optim_cls)

    fopt.register_overlapped(MySGD)(make)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):
        fopt.register_overlapped(MySGD)(make)  # type: ignore[arg-type]
    params = [nn.Parameter(torch.ones(2))]
    assert isinstance(fopt._as_overlapped_optim(MySGD, params, lr=0.1), MyOverlapped)
    standard = fopt._as_overlapped_optim(torch.optim.Adam, params, lr=0.1)
    assert type(standard).__name__ == "_OverlappedStandardOptimizer"
    with pytest.raises(NotImplementedError):
        standard.register_fsdp(None)
    with pytest.raises(ValueError, match="does not have a functional counterpart"):
        fopt._as_overlapped_optim(torch.optim.LBFGS, params, lr=0.1)


def test_optimizer_class_resolution_for_overlap_mode() -> None:
    from torch.distributed.optim.utils import functional_optim_map

    from ferrodist.optim._params import resolve_optimizer_class

    functional_adam = functional_optim_map[torch.optim.Adam]
    assert resolve_optimizer_class(torch.optim.Adam, overlap_with_ddp=True) is functional_adam
    assert resolve_optimizer_class(torch.optim.Adam, overlap_with_ddp=False) is torch.optim.Adam
    with pytest.raises(ValueError, match="when `overlap_with_ddp=False`"):
        resolve_optimizer_class(functional_adam, overlap_with_ddp=False)
    with pytest.raises(ValueError, match="no supported functional optimizer equivalent"):
        resolve_optimizer_class(torch.optim.LBFGS, overlap_with_ddp=True)


def test_param_groups_given_as_generators_are_not_exhausted() -> None:
    from ferrodist.optim._params import verify_params

    model = nn.Linear(3, 2)
    user_group = {"params": model.parameters(), "lr": 0.3}
    groups, tensors = verify_params([user_group])
    assert groups[0]["params"] == list(model.parameters()) == tensors
    assert groups[0]["lr"] == 0.3


def test_overlap_bucket_assignment_errors_are_assertion_errors_as_in_torch() -> None:
    from ferrodist.optim._overlap_state import _OverlapInfo, assign_buckets

    info = _OverlapInfo(world_size=2)
    info.shard_buckets = True
    # One bucket cut into three slices cannot go to two distinct ranks (torch fails the same).
    info.params_per_bucket = [[torch.zeros(60), torch.zeros(60), torch.zeros(60)]]
    with pytest.raises(AssertionError, match="All indices are disallowed"):
        assign_buckets(info, world_size=2, rank=0)
    info.shard_buckets = False
    info.params_per_bucket = [[torch.zeros(3)], [torch.zeros(4)], [torch.zeros(5)]]
    per_rank = assign_buckets(info, world_size=2, rank=1)
    assert [sorted(r) for r in per_rank] == [[0, 2], [1]]
    assert info.offsets == {1: 0} and info.num_bucket_assignments == 3
