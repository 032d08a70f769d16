"""ferrodist's DDP in a one-rank gloo group: the API surface, errors and logging data."""

from __future__ import annotations

import copy
import gc
import pickle
import weakref
from typing import Iterator

import pytest
import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
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


def _logging_keys_after(ddp: torch.nn.Module, steps: int) -> set[str]:
    for _ in range(steps):
        ddp(torch.randn(4, 4)).sum().backward()
    return set(ddp._get_ddp_logging_data())


# Keys torch 2.13's logging data has and older releases (2.4) lack; ferrodist reports 2.13's.
_NEWER_LOGGING_KEYS = {"num_buckets_reduced", "unused_parameter_size"}


def _same_keys(ours: set, theirs: set) -> bool:
    """torch's keys exactly, but for keys an older installed torch does not report yet."""
    return theirs <= ours and ours - theirs <= _NEWER_LOGGING_KEYS


@pytest.mark.parametrize(
    "options", [{}, {"static_graph": True}, {"find_unused_parameters": True}], ids=str
)
def test_logging_data_keys_equal_torchs_at_every_stage(world: None, options: dict) -> None:
    ours, theirs = FerroDDP(_net(), **options), TorchDDP(_net(), **options)
    assert _same_keys(set(ours._get_ddp_logging_data()), set(theirs._get_ddp_logging_data()))
    assert _same_keys(_logging_keys_after(ours, 1), _logging_keys_after(theirs, 1))
    assert _same_keys(_logging_keys_after(ours, 2), _logging_keys_after(theirs, 2))
    ours.register_comm_hook(None, default_hooks.allreduce_hook)
    theirs.register_comm_hook(None, torch_hooks.allreduce_hook)
    assert _same_keys(_logging_keys_after(ours, 1), _logging_keys_after(theirs, 1))


def test_logging_data_bucket_figures_equal_torchs(world: None) -> None:
    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])

    ours, theirs = FerroDDP(net(), bucket_cap_mb=0.02), TorchDDP(net(), bucket_cap_mb=0.02)
    keys = (
        "has_rebuilt_buckets",
        "rebuilt_bucket_sizes",
        "rebuilt_per_bucket_param_indices",
        "num_buckets_reduced",
        "prev_iteration_grad_ready_order_indices",
        "iteration",
        "bucket_sizes",
    )
    for _ in range(4):
        for ddp in (ours, theirs):
            ddp(torch.randn(3, 64)).sum().backward()
        mine, reference = ours._get_ddp_logging_data(), theirs._get_ddp_logging_data()
        shared = [k for k in keys if k in reference or k not in _NEWER_LOGGING_KEYS]
        assert {k: mine.get(k) for k in shared} == {k: reference.get(k) for k in shared}


def test_second_hook_is_recorded_as_an_error_like_torch(world: None) -> None:
    for ddp, hooks in (
        (FerroDDP(_net()), default_hooks),
        (TorchDDP(_net()), torch_hooks),
    ):
        assert "has_error" not in ddp._get_ddp_logging_data()
        ddp.register_comm_hook(None, hooks.allreduce_hook)
        with pytest.raises(RuntimeError) as raised:
            ddp.register_comm_hook(None, hooks.allreduce_hook)
        data = ddp._get_ddp_logging_data()
        assert data["has_error"] == 1 and data["error"] == str(raised.value)


def _future_of(value: object) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut


@pytest.mark.parametrize("returns", ["int_future", "two_tensor_future", "not_a_future"])
def test_hook_with_a_wrong_return_type_fails_like_torch(world: None, returns: str) -> None:
    def hook(state, bucket):  # type: ignore[no-untyped-def]  # torch refuses string annotations
        if returns == "int_future":
            return _future_of(3)
        if returns == "two_tensor_future":
            return _future_of([bucket.buffer(), bucket.buffer()])
        return 5  # type: ignore[return-value]

    errors = []
    for cls in (FerroDDP, TorchDDP):
        ddp = cls(torch.nn.Linear(4, 4))
        ddp.register_comm_hook(None, hook)
        with pytest.raises(RuntimeError) as raised:
            ddp(torch.ones(2, 4)).sum().backward()
        errors.append(str(raised.value))
        assert "has_error" not in ddp._get_ddp_logging_data()
    ours, theirs = errors
    assert theirs.endswith(ours) if returns == "not_a_future" else ours == theirs


def test_prepare_for_backward_takes_a_tensor_or_a_list(world: None) -> None:
    used, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    group = tdist.group.WORLD
    for outputs in (lambda: used * 2, lambda: [used * 2]):
        for cls in (ferrodist.Reducer, tdist.Reducer):
            reducer = cls([used, unused], [[0, 1]], [100], group, [], 1 << 20, True)
            out = outputs()
            reducer.prepare_for_backward(out)
            (out if isinstance(out, torch.Tensor) else out[0]).sum().backward()
            assert used.grad is not None and used.grad.tolist() == [2.0, 2.0, 2.0]
            assert unused.grad is None
            used.grad = None


def test_bucket_with_mixed_dtypes_raises_torchs_error(world: None) -> None:
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2).double())]
    errors = []
    for cls in (ferrodist.Reducer, tdist.Reducer):
        with pytest.raises(RuntimeError) as raised:
            cls(params, [[0, 1]], [100], tdist.group.WORLD)
        errors.append(str(raised.value))
    assert errors[0] == errors[1]


def test_delay_all_reduce_arguments_come_in_pairs_like_torch(world: None) -> None:
    net = _net()
    for cls in (FerroDDP, TorchDDP):
        with pytest.raises(ValueError, match="need to be set at the same time"):
            cls(_net(), delay_all_reduce_named_params=[])
        with pytest.raises(ValueError, match="need to be set at the same time"):
            cls(net, param_to_hook_all_reduce=net[0].weight)


def test_a_dropped_ddp_and_its_model_are_garbage_collected(world: None) -> None:
    """Each parameter's hook calls back into the Reducer, and torch keeps a tensor's hooks out of
    the garbage collector's sight: held strongly, the Reducer (with every parameter and a
    gradient-sized bucket buffer) outlived its DDP forever, as it did before the hook held it
    weakly. torch's DDP is collected the same way."""
    for ddp_class in (TorchDDP, FerroDDP):
        model = _net()
        ddp = ddp_class(model)
        ddp(torch.randn(3, 4)).sum().backward()
        refs = [weakref.ref(o) for o in (model, ddp, ddp.reducer, next(model.parameters()))]
        del model, ddp
        gc.collect()
        assert [r() is None for r in refs] == [True] * 4, ddp_class


def test_a_deepcopied_or_pickled_ddp_trains_on_its_own_reducer_like_torch(world: None) -> None:
    x = torch.randn(5, 4)
    for ddp_class in (TorchDDP, FerroDDP):
        ddp = ddp_class(_net())
        ddp(x).sum().backward()
        for clone in (copy.deepcopy(ddp), pickle.loads(pickle.dumps(ddp))):
            assert clone.reducer is not ddp.reducer
            assert clone.process_group is ddp.process_group  # the default group
            for model in (ddp, clone):
                model.zero_grad()
                model(x).sum().backward()
            for ours, copied in zip(ddp.parameters(), clone.parameters()):
                assert copied is not ours
                assert torch.equal(copied.grad, ours.grad)  # type: ignore[arg-type]


def test_a_ddp_over_another_group_refuses_to_be_copied_with_torchs_error(world: None) -> None:
    group = tdist.new_group([0])
    errors = []
    for ddp_class in (TorchDDP, FerroDDP):
        ddp = ddp_class(_net(), process_group=group)
        with pytest.raises(RuntimeError) as caught:
            copy.deepcopy(ddp)
        errors.append(str(caught.value))
        if ddp_class is FerroDDP:
            assert ddp._get_ddp_logging_data()["has_error"] == 1
    assert errors[0] == errors[1]
