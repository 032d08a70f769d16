"""Per-rank memory of an FSDP run, estimated before the run from shapes and dtypes alone.

DeepSpeed prints such an estimate for ZeRO-2/3; torch has none. :func:`estimate_memory` finds the
flat parameters torch's ``FullyShardedDataParallel`` would build (one per wrapped module, the
wrap policy decides which), plans each one's layout in the Rust core (``plan_flat_param``, so
alignment, world-size and shard padding are counted exactly as torch allocates them) and adds up
what every rank keeps: its parameter shard, its gradient shard and the optimizer state. Nothing
of the model is allocated; a model on the ``meta`` device works.

Which flat parameters exist is ``_memory_units``'s question; what the optimizer keeps per
parameter is ``_memory_optim``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import _Policy

from ._layout import FlatParamLayout, plan_flat_param
from ._memory_optim import StateShape, optimizer_state
from ._memory_units import Unit, flat_param_units, ignored_subtrees

_SHARDED = {
    ShardingStrategy.FULL_SHARD,
    ShardingStrategy.SHARD_GRAD_OP,
    ShardingStrategy.HYBRID_SHARD,
    ShardingStrategy._HYBRID_SHARD_ZERO2,
}
_HYBRID = {ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2}
# Strategies that keep every unsharded parameter from forward to backward (torch frees them
# after forward only under FULL_SHARD and HYBRID_SHARD, and never the root's).
_KEEP_AFTER_FORWARD = {ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy._HYBRID_SHARD_ZERO2}


@dataclass(frozen=True)
class FlatParamMemory:
    """One flat parameter (FSDP unit) and what it costs one rank.

    Attributes:
        module_name: qualified name of the wrapped module ("" for the root).
        dtype: the parameters' dtype (the sharded flat parameter's).
        layout: the flat parameter's layout over the sharding group.
        param_bytes: the rank's flat parameter (its shard, or all of it under NO_SHARD).
        grad_bytes: the rank's gradient of it (0 when no parameter requires a gradient).
        optimizer_state_bytes: the optimizer state of the rank's part of it.
        unsharded_bytes: the all-gathered (padded, compute-dtype) parameter while in use.
        is_root: whether this is the root module's flat parameter.
    """

    module_name: str
    dtype: torch.dtype
    layout: FlatParamLayout
    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    unsharded_bytes: int
    is_root: bool


@dataclass(frozen=True)
class MemoryEstimate:
    """What one rank keeps of an FSDP model, in bytes.

    Parameters of ``ignored_modules`` are counted whole in all three (every rank keeps them, and
    an optimizer over the FSDP model's parameters steps them).

    Attributes:
        param_bytes: parameter shards (padding included).
        grad_bytes: gradient shards after backward (padding included).
        optimizer_state_bytes: optimizer state (the flat shards' under ``use_orig_params=False``,
            padding included; the original parameters' slices under ``use_orig_params=True``).
        total_bytes: the sum of the three: what stays allocated between steps while gradients
            are kept.
        forward_held_bytes: unsharded parameters still held from the end of forward to
            backward, on top of ``total_bytes``: every unit under SHARD_GRAD_OP (and
            ``_HYBRID_SHARD_ZERO2``), the root unit under FULL_SHARD and HYBRID_SHARD, none under
            NO_SHARD. Activations are not counted.
        rank: the rank (in the sharding group) described; by default the one with the largest
            ``total_bytes`` (ranks differ only with ``use_orig_params=True``).
        sharding_strategy: the strategy torch applies (NO_SHARD when the sharding group has
            one rank, as torch switches).
        units: each flat parameter, in the order torch wraps them (innermost first, root last).
    """

    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    total_bytes: int
    forward_held_bytes: int
    rank: int
    sharding_strategy: ShardingStrategy
    units: tuple[FlatParamMemory, ...]


def estimate_memory(
    model: nn.Module,
    world_size: int,
    sharding_strategy: ShardingStrategy = ShardingStrategy.FULL_SHARD,
    mixed_precision: MixedPrecision | None = None,
    optimizer: type[torch.optim.Optimizer] | torch.optim.Optimizer | None = torch.optim.Adam,
    *,
    auto_wrap_policy: _Policy | Callable[..., bool] | None = None,
    use_orig_params: bool = False,
    ignored_modules: Iterable[nn.Module] | None = None,
    intra_size: int | None = None,
    rank: int | None = None,
) -> MemoryEstimate:
    """Estimate one rank's parameter, gradient and optimizer-state bytes under torch's FSDP.

    Args:
        model: the module that would be wrapped (parameters on any device, ``meta`` included).
        world_size: ranks of the job.
        sharding_strategy: as for ``FullyShardedDataParallel``.
        mixed_precision: as for ``FullyShardedDataParallel``; its ``param_dtype`` sets the
            alignment (``use_orig_params=True``) and the unsharded size, and
            ``keep_low_precision_grads`` the gradients' dtype.
        optimizer: an optimizer class (its default hyper-parameters) or instance (its
            ``defaults``) to be built over the FSDP model's parameters; ``None`` for no state.
        auto_wrap_policy: as for ``FullyShardedDataParallel`` (a policy object such as
            ``ModuleWrapPolicy`` or a callable such as ``size_based_auto_wrap_policy``).
        use_orig_params: as for ``FullyShardedDataParallel``.
        ignored_modules: as for ``FullyShardedDataParallel``; their parameters are counted whole
            on every rank.
        intra_size: ranks per sharding group for the hybrid strategies (default: world_size).
        rank: the rank in the sharding group to describe (default: the largest).

    Raises:
        TypeError, ValueError: for an argument of the wrong type or value, naming it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(sharding_strategy, ShardingStrategy):
        raise TypeError(f"sharding_strategy must be a ShardingStrategy, got {sharding_strategy!r}")
    if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
        raise TypeError(
            f"mixed_precision must be a MixedPrecision or None, got {mixed_precision!r}"
        )
    shard_world = _shard_world(world_size, sharding_strategy, intra_size)
    strategy = sharding_strategy if shard_world > 1 else ShardingStrategy.NO_SHARD
    ignored = ignored_subtrees(ignored_modules)
    units = flat_param_units(model, auto_wrap_policy, ignored, mixed_precision)
    state = optimizer_state(optimizer)
    layouts = [_plan(unit, shard_world, use_orig_params) for unit in units]
    plain = _plain_memory(ignored, state)
    ranks = range(shard_world) if rank is None else [rank]
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < shard_world):
        raise ValueError(f"rank must be in [0, {shard_world}), got {rank!r}")
    if not use_orig_params and rank is None:
        ranks = range(1)  # every rank holds the same flat shards
    best: MemoryEstimate | None = None
    for r in ranks:
        memories = tuple(
            _unit_memory(unit, layout, r, strategy, use_orig_params, state)
            for unit, layout in zip(units, layouts)
        )
        estimate = _total(memories, plain, r, strategy)
        if best is None or estimate.total_bytes > best.total_bytes:
            best = estimate
    assert best is not None
    return best


def _positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _shard_world(world_size: int, strategy: ShardingStrategy, intra_size: int | None) -> int:
    """Ranks one flat parameter is sharded over: the intra group for the hybrid strategies."""
    world_size = _positive_int("world_size", world_size)
    if intra_size is None:
        return world_size
    intra_size = _positive_int("intra_size", intra_size)
    if strategy not in _HYBRID:
        raise ValueError(f"intra_size applies to the hybrid strategies only, not {strategy}")
    if world_size % intra_size:
        raise ValueError(f"intra_size {intra_size} does not divide world_size {world_size}")
    return intra_size


def _compute_dtype(unit: Unit) -> torch.dtype:
    """The dtype of the unit's parameters in forward and backward."""
    mp = unit.mixed_precision
    return (mp.param_dtype if mp is not None else None) or unit.params[0].dtype


def _plan(unit: Unit, shard_world: int, use_orig_params: bool) -> FlatParamLayout:
    return plan_flat_param(
        [p.numel() for p in unit.params],
        _compute_dtype(unit).itemsize,
        shard_world,
        align_addresses=use_orig_params,
    )


def _unit_memory(
    unit: Unit,
    layout: FlatParamLayout,
    rank: int,
    strategy: ShardingStrategy,
    use_orig_params: bool,
    state: Callable[[torch.dtype], StateShape],
) -> FlatParamMemory:
    dtype = unit.params[0].dtype
    sharded = strategy in _SHARDED
    local_numel = layout.shard_numel if sharded else layout.flat_numel
    trainable = [p.requires_grad for p in unit.params]
    grad_dtype = _grad_dtype(dtype, unit.mixed_precision)
    grad_bytes = local_numel * grad_dtype.itemsize if any(trainable) else 0
    shape = state(dtype)
    if not use_orig_params:
        # The optimizer sees the flat parameter: its whole local numel, padding included.
        state_bytes = local_numel * shape.per_element_bytes + shape.per_param_bytes
        state_bytes = state_bytes if any(trainable) else 0
    else:
        # The optimizer sees the original parameters as views of this rank's slices; a
        # parameter outside the shard gets no gradient and so no state.
        infos = layout.shard_param_infos(rank) if sharded else layout.unsharded_param_infos()
        state_bytes = sum(
            (info.numel_in_shard or 0) * shape.per_element_bytes + shape.per_param_bytes
            for info, needs_grad in zip(infos, trainable)
            if info.in_shard and needs_grad
        )
    unsharded = layout.padded_unsharded_numel * _compute_dtype(unit).itemsize
    return FlatParamMemory(
        module_name=unit.module_name,
        dtype=dtype,
        layout=layout,
        param_bytes=local_numel * dtype.itemsize,
        grad_bytes=grad_bytes,
        optimizer_state_bytes=state_bytes,
        unsharded_bytes=unsharded if sharded else 0,
        is_root=unit.is_root,
    )


def _grad_dtype(dtype: torch.dtype, mp: MixedPrecision | None) -> torch.dtype:
    """The sharded gradient's dtype: the parameter's, or the reduce dtype when torch keeps
    low-precision gradients."""
    if mp is None or not mp.keep_low_precision_grads:
        return dtype
    return mp.reduce_dtype or mp.param_dtype or dtype


def _plain_memory(
    ignored: set[nn.Module], state: Callable[[torch.dtype], StateShape]
) -> tuple[int, int, int]:
    """Parameter, gradient and optimizer-state bytes of the ignored modules' parameters, which
    every rank keeps whole (FSDP leaves them as they are; the optimizer still steps them)."""
    params = {p for m in ignored for p in m.parameters()}
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    trainable = [p for p in params if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)
    state_bytes = 0
    for p in trainable:
        shape = state(p.dtype)
        state_bytes += p.numel() * shape.per_element_bytes + shape.per_param_bytes
    return param_bytes, grad_bytes, state_bytes


def _total(
    units: Sequence[FlatParamMemory],
    plain: tuple[int, int, int],
    rank: int,
    strategy: ShardingStrategy,
) -> MemoryEstimate:
    params = sum(u.param_bytes for u in units) + plain[0]
    grads = sum(u.grad_bytes for u in units) + plain[1]
    state = sum(u.optimizer_state_bytes for u in units) + plain[2]
    if strategy in _KEEP_AFTER_FORWARD:
        held = sum(u.unsharded_bytes for u in units)
    else:
        held = sum(u.unsharded_bytes for u in units if u.is_root)
    return MemoryEstimate(
        param_bytes=params,
        grad_bytes=grads,
        optimizer_state_bytes=state,
        total_bytes=params + grads + state,
        forward_held_bytes=held,
        rank=rank,
        sharding_strategy=strategy,
        units=tuple(units),
    )
