"""ferrodist's DDP in a one-rank gloo group: the API surface, errors and logging data."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ferrodist
from ferrodist.algorithms.ddp_comm_hooks import default_hooks
from ferrodist.nn import DistributedDataParallel as FerroDDP


@pytest.fixture
def world() -> Iterator[None]:
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    yield None
    tdist.destroy_process_group()


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )


def test_second_hook_is_refused_like_torch(world: None) -> None:
    ddp = FerroDDP(_net())
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match=r"^register_comm_hook or register_builtin_comm_hook"):
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match=r"^register_builtin_comm_hook or register_comm_hook"):
        ddp._register_builtin_comm_hook(ferrodist.BuiltinCommHookType.ALLREDUCE)


def test_module_without_trainable_parameters_is_refused(world: None) -> None:
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
        FerroDDP(frozen)
    with pytest.raises(ValueError, match="device_ids and output_device"):
        FerroDDP(torch.nn.Linear(2, 2), device_ids=[0])
    with pytest.raises(NotImplementedError, match=r"sparse gradients yet \(weight\)"):
        FerroDDP(torch.nn.Embedding(4, 2, sparse=True))


def test_state_dict_and_attributes_match_torch(world: None) -> None:
    ours, theirs = FerroDDP(_net()), TorchDDP(_net())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for name in ("bucket_bytes_cap", "find_unused_parameters", "gradient_as_bucket_view", "dim"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.process_group is theirs.process_group


def test_logging_data_has_torchs_keys(world: None) -> None:
    ours, theirs = FerroDDP(_net()), TorchDDP(_net())
    for ddp in (ours, theirs):
        for _ in range(3):
            ddp(torch.randn(4, 4)).sum().backward()
    mine, reference = ours._get_ddp_logging_data(), theirs._get_ddp_logging_data()
    shared = [
        "world_size",
        "rank",
        "module_name",
        "backend_name",
        "bucket_cap_bytes",
        "find_unused_parameters",
        "gradient_as_bucket_view",
        "num_parameter_tensors",
        "total_parameter_size_bytes",
        "dtypes",
        "has_rebuilt_buckets",
        "iteration",
    ]
    for key in shared:
        assert mine[key] == reference[key], key
    for key in ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time"):
        assert mine[key] > 0, key


def test_reducer_rejects_bad_bucket_indices(world: None) -> None:
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]
    group = tdist.group.WORLD
    with pytest.raises(ValueError, match="every parameter index exactly once"):
        ferrodist.Reducer(params, [[0]], [100], group)
    reducer = ferrodist.Reducer(params, [[1, 0]], [100], group)
    logger = ferrodist.Logger(reducer)
    reducer.set_logger(logger)
    buckets = reducer._get_zeros_like_grad_buckets()
    assert [b.buffer().numel() for b in buckets] == [5] and buckets[0].is_last()
