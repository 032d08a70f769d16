"""FSDP flat-parameter layout: ``plan_flat_param`` against torch's own ``FlatParamHandle``.

torch builds the handle from a module's parameters and a process group, and reads only the
group's ``rank()`` and ``size()`` while flattening and sharding (no collective runs). So every
rank of any world size is checked in one process: a handle per rank, built over a stand-in
group, and every layout field torch keeps is compared with the plan. One test also runs torch's
FSDP itself on a one-process gloo group, in a process of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _procs import finish, spawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.fsdp._flat_param import FlatParamHandle, HandleShardingStrategy

from ferrodist.fsdp import FlatParamLayout, ShardParamInfo, plan_flat_param


class _Group:
    """What ``FlatParamHandle`` reads of its process group while it flattens and shards."""

    def __init__(self, rank: int, world_size: int) -> None:
        self._rank, self._size = rank, world_size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def _module(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> nn.Module:
    module = nn.Module()
    for i, shape in enumerate(shapes):
        module.register_parameter(f"p{i}", nn.Parameter(torch.zeros(shape, dtype=dtype)))
    return module


def _torch_handle(
    shapes: list[tuple[int, ...]],
    dtype: torch.dtype,
    mp_dtype: torch.dtype | None,
    rank: int,
    world_size: int,
    use_orig_params: bool,
    strategy: HandleShardingStrategy = HandleShardingStrategy.FULL_SHARD,
) -> FlatParamHandle:
    # A fresh module per handle: torch rebinds the module's parameters to views of its flat one.
    module = _module(shapes, dtype)
    handle = FlatParamHandle(
        list(module.parameters()),
        module,
        torch.device("cpu"),
        strategy,
        False,
        mp_dtype,
        None,
        False,
        _Group(rank, world_size),
        use_orig_params,
    )
    handle.shard()
    handle.init_flat_param_attributes()  # sets the padded unsharded (all-gather) size
    return handle


def _infos(handle: FlatParamHandle) -> tuple[ShardParamInfo, ...]:
    return tuple(ShardParamInfo(*info) for info in handle.flat_param._shard_param_infos)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


shapes_strategy = st.lists(
    st.lists(st.one_of(st.just(0), st.integers(1, 9)), min_size=1, max_size=3).map(tuple),
    min_size=1,
    max_size=8,
).filter(lambda shapes: any(_numel(s) > 0 for s in shapes))
dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16])


def _check_against_torch(
    layout: FlatParamLayout,
    shapes: list[tuple[int, ...]],
    dtype: torch.dtype,
    mp_dtype: torch.dtype | None,
    use_orig_params: bool,
) -> None:
    world_size = layout.world_size
    # Every other parameter selected: the per-rank totals must sum torch's infos.
    selected = [i % 2 == 0 for i in range(len(shapes))]
    totals = layout.shard_totals(selected)
    assert len(totals) == world_size
    for rank in range(world_size):
        handle = _torch_handle(shapes, dtype, mp_dtype, rank, world_size, use_orig_params)
        flat = handle.flat_param
        assert layout.numels == tuple(flat._numels)
        assert layout.numels_with_padding == tuple(flat._numels_with_padding)
        assert layout.is_padding_mask == tuple(flat._is_padding_mask)
        assert layout.flat_numel == flat._unpadded_unsharded_size.numel()
        assert (layout.shard_numel,) == tuple(flat._sharded_size)
        assert layout.shard_numel == flat.numel()
        assert layout.padded_unsharded_numel == flat._padded_unsharded_size.numel()
        assert layout.shard_padding(rank) == flat._shard_numel_padded
        assert layout.shard_param_infos(rank) == _infos(handle)
        held = [i for i, chosen in zip(_infos(handle), selected) if i.in_shard and chosen]
        assert totals[rank] == (sum(i.numel_in_shard or 0 for i in held), len(held))
        # The shard's unpadded part is exactly torch's chunk of the unsharded flat parameter.
        start, end = layout.shard_range(rank)
        assert end - start == flat.numel() - flat._shard_numel_padded
        offsets = [o for o, _ in handle._get_flat_param_offsets()]
        params = [o for o, pad in zip(offsets, flat._is_padding_mask) if not pad]
        assert layout.param_offsets == tuple(params)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shapes=shapes_strategy,
    dtype=dtypes,
    mp_dtype=st.one_of(st.none(), dtypes),
    world_size=st.integers(1, 12),
    use_orig_params=st.booleans(),
)
def test_layout_matches_torch_flat_param_handle(
    shapes: list[tuple[int, ...]],
    dtype: torch.dtype,
    mp_dtype: torch.dtype | None,
    world_size: int,
    use_orig_params: bool,
) -> None:
    # torch aligns with the forward/backward dtype: the mixed-precision one when given.
    itemsize = (mp_dtype or dtype).itemsize
    layout = plan_flat_param(
        [_numel(s) for s in shapes], itemsize, world_size, align_addresses=use_orig_params
    )
    _check_against_torch(layout, shapes, dtype, mp_dtype, use_orig_params)


@pytest.mark.parametrize(
    ("numels", "world_size"),
    [([5], 4), ([1], 8), ([3, 0, 0, 2], 3), ([0, 7, 0], 5), ([2, 3], 1), ([100, 1, 1], 7)],
)
@pytest.mark.parametrize("use_orig_params", [False, True])
def test_edge_layouts_match_torch(
    numels: list[int], world_size: int, use_orig_params: bool
) -> None:
    """World sizes above the numel (whole ranks of padding), empty parameters, world size 1."""
    layout = plan_flat_param(numels, 4, world_size, align_addresses=use_orig_params)
    _check_against_torch(layout, [(n,) for n in numels], torch.float32, None, use_orig_params)


@settings(max_examples=40, deadline=None)
@given(shapes=shapes_strategy, world_size=st.integers(1, 6), use_orig_params=st.booleans())
def test_no_shard_infos_match_torch(
    shapes: list[tuple[int, ...]], world_size: int, use_orig_params: bool
) -> None:
    """NO_SHARD keeps the whole flat parameter (world-size padding included) on every rank."""
    layout = plan_flat_param(
        [_numel(s) for s in shapes], 4, world_size, align_addresses=use_orig_params
    )
    handle = _torch_handle(
        shapes, torch.float32, None, 0, world_size, use_orig_params, HandleShardingStrategy.NO_SHARD
    )
    assert handle.flat_param.numel() == layout.flat_numel
    assert layout.unsharded_param_infos() == _infos(handle)


_ONE_PROCESS_FSDP = """
import gc, sys, warnings
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from ferrodist.fsdp import ShardParamInfo, plan_flat_param

dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
def check(use_orig_params):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 7, bias=False))
    numels = [p.numel() for p in model.parameters()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fsdp = FSDP(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params)
    assert any("switching to use `NO_SHARD`" in str(w.message) for w in caught)
    flat = fsdp._handle.flat_param
    layout = plan_flat_param(numels, 4, 1, align_addresses=use_orig_params)
    assert layout.numels_with_padding == tuple(flat._numels_with_padding)
    assert layout.is_padding_mask == tuple(flat._is_padding_mask)
    assert layout.flat_numel == flat.numel()
    infos = tuple(ShardParamInfo(*i) for i in flat._shard_param_infos)
    assert layout.unsharded_param_infos() == infos, (layout, infos)
    # ferrodist's FSDP clamps to NO_SHARD at world 1 too, with torch's warning.
    from ferrodist.fsdp import FullyShardedDataParallel as Ours
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3), nn.ReLU(), nn.Linear(3, 7, bias=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = Ours(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params)
    assert any("switching to use `NO_SHARD`" in str(w.message) for w in caught)
    assert ours.sharding_strategy == fsdp.sharding_strategy, ours.sharding_strategy
    print("checked", use_orig_params, layout.numels_with_padding)
# In a function, so that no global holds the FSDP modules, and with them the group, into
# interpreter exit (a gloo worker that takes the GIL then aborts the process).
for use_orig_params in (False, True):
    check(use_orig_params)
gc.collect()  # FSDP modules sit in reference cycles
dist.destroy_process_group()
"""


def test_torch_fsdp_on_one_process_group_matches(tmp_path: Path) -> None:
    """torch's FSDP itself (world 1, so NO_SHARD) lays out a real model as planned, with and
    without ``use_orig_params``, and ferrodist's clamps to NO_SHARD as torch's does. In its own
    process: a process group made in pytest's process leaves state that hangs the forked worlds
    of later tests."""
    (out,) = finish([spawn(_ONE_PROCESS_FSDP, str(tmp_path / "pg"))], timeout=120)
    assert "checked False" in out and "checked True" in out, out


def test_arguments_are_checked_by_name() -> None:
    with pytest.raises(ValueError, match=r"^numels"):
        plan_flat_param([], 4, 2, align_addresses=False)
    with pytest.raises(ValueError, match=r"^numels"):
        plan_flat_param([0, 0], 4, 2, align_addresses=False)
    with pytest.raises(ValueError, match=r"^numels\[1\] = -3"):
        plan_flat_param([1, -3], 4, 2, align_addresses=False)
    with pytest.raises(ValueError, match=r"^itemsize"):
        plan_flat_param([1], 0, 2, align_addresses=False)
    with pytest.raises(ValueError, match=r"^world_size"):
        plan_flat_param([1], 4, 0, align_addresses=False)
    with pytest.raises(TypeError, match=r"^numels"):
        plan_flat_param("12", 4, 2, align_addresses=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^world_size"):
        plan_flat_param([1], 4, 2.0, align_addresses=False)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^align_addresses"):
        plan_flat_param([1], 4, 2, align_addresses=1)  # type: ignore[arg-type]
    layout = plan_flat_param([4], 4, 2, align_addresses=False)
    with pytest.raises(ValueError, match=r"^rank"):
        layout.shard_range(2)
    with pytest.raises(ValueError, match=r"^rank"):
        layout.shard_param_infos(-1)
