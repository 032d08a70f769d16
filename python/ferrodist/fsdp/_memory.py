"""Per-rank memory of an FSDP run, estimated before the run from shapes and dtypes alone.

DeepSpeed prints such an estimate for ZeRO-2/3; torch has none. :func:`estimate_memory` finds the
flat parameters torch's ``FullyShardedDataParallel`` would build (one per wrapped module, the
wrap policy decides which), plans each one's layout in the Rust core (``plan_flat_param``, so
alignment, world-size and shard padding are counted exactly as torch allocates them) and adds up
what every rank keeps: its parameter shard, its gradient shard and the optimizer state. Nothing
of the model is allocated; a model on the ``meta`` device works.

The optimizer's state is learned from the optimizer itself: one step on a three-element
parameter tells which state tensors grow with the parameter (``exp_avg``, ``momentum_buffer``)
and which are per-parameter scalars (``step``), so any ``torch.optim`` optimizer and its
hyper-parameters (``amsgrad``, ``momentum``) are covered without a table.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import _Policy

from ._layout import FlatParamLayout, plan_flat_param

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
    ignored = _ignored(model, ignored_modules)
    units = _flat_param_units(model, auto_wrap_policy, ignored, mixed_precision)
    state = _optimizer_state(optimizer)
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


@dataclass(frozen=True)
class _Unit:
    """The parameters one FSDP instance flattens, and its mixed-precision setting."""

    module_name: str
    params: tuple[nn.Parameter, ...]
    mixed_precision: MixedPrecision | None
    is_root: bool


def _ignored(model: nn.Module, ignored_modules: Iterable[nn.Module] | None) -> set[nn.Module]:
    """The ignored modules with their whole subtrees, as torch expands them."""
    if ignored_modules is None:
        return set()
    out: set[nn.Module] = set()
    for module in ignored_modules:
        if not isinstance(module, nn.Module):
            raise TypeError(f"ignored_modules must hold nn.Modules, got {type(module).__name__}")
        out.update(module.modules())
    return out


def _flat_param_units(
    model: nn.Module,
    policy: _Policy | Callable[..., bool] | None,
    ignored: set[nn.Module],
    mixed_precision: MixedPrecision | None,
) -> list[_Unit]:
    """The flat parameters torch builds, innermost wrapped module first and the root last.

    A wrapped module flattens its parameters not already taken by a module wrapped before it
    (torch wraps in post-order), skipping ignored ones; the root takes the rest.
    """
    ignored_params = {p for m in ignored for p in m.parameters()}
    mp_classes: tuple[type[nn.Module], ...] = (
        tuple(mixed_precision._module_classes_to_ignore) if mixed_precision is not None else ()
    )
    targets = _wrap_targets(model, policy, ignored, ignored_params, mp_classes)
    names = {module: name for name, module in model.named_modules()}
    taken: set[nn.Parameter] = set(ignored_params)
    units = []
    for module in [*targets, model]:
        params = tuple(p for p in module.parameters() if p not in taken)
        taken.update(params)
        if params:
            mp = None if isinstance(module, mp_classes) else mixed_precision
            units.append(_Unit(names[module], params, mp, module is model))
    return units


def _wrap_targets(
    model: nn.Module,
    policy: _Policy | Callable[..., bool] | None,
    ignored: set[nn.Module],
    ignored_params: set[nn.Parameter],
    mp_classes: tuple[type[nn.Module], ...],
) -> list[nn.Module]:
    """The modules below the root that torch wraps, in its post-order."""
    if policy is None:
        return []
    if isinstance(policy, _Policy):
        chosen = set(policy._run_policy(model, ignored, {}))
        if mp_classes:
            chosen.update(
                m for m in model.modules() if m not in ignored and isinstance(m, mp_classes)
            )
        return [m for m in _post_order(model) if m in chosen and m is not model]
    if not callable(policy):
        raise TypeError(f"auto_wrap_policy must be a policy object or callable, got {policy!r}")
    if mp_classes:
        policy = functools.partial(_or_mp_classes, policy=policy, mp_classes=mp_classes)
    wrapped: list[nn.Module] = []
    _recursive_targets(model, policy, ignored, ignored_params, wrapped, only_children=True)
    return wrapped


def _or_mp_classes(
    *,
    module: nn.Module,
    recurse: bool,
    nonwrapped_numel: int,
    policy: Callable[..., bool],
    mp_classes: tuple[type[nn.Module], ...],
) -> bool:
    """torch's ``_or_policy`` of the user's policy and wrapping the mixed-precision-ignored
    module classes individually."""
    if policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel):
        return True
    return recurse or isinstance(module, mp_classes)


def _recursive_targets(
    module: nn.Module,
    policy: Callable[..., bool],
    ignored: set[nn.Module],
    ignored_params: set[nn.Parameter],
    wrapped: list[nn.Module],
    only_children: bool = False,
) -> int:
    """torch's ``_recursive_wrap`` decisions for a callable policy, recording instead of
    wrapping. Returns the numel wrapped under ``module``."""
    numel = sum(p.numel() for p in module.parameters() if p not in ignored_params)
    if not policy(module=module, recurse=True, nonwrapped_numel=numel):
        return 0
    wrapped_numel = 0
    for child in module.children():
        if child not in ignored:
            wrapped_numel += _recursive_targets(child, policy, ignored, ignored_params, wrapped)
    if not only_children and policy(
        module=module, recurse=False, nonwrapped_numel=numel - wrapped_numel
    ):
        wrapped.append(module)
        return numel
    return wrapped_numel


def _post_order(root: nn.Module) -> list[nn.Module]:
    """Modules in the order torch's ``_post_order_apply`` visits them (each once)."""
    seen = {root}
    order: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if child not in seen:
                seen.add(child)
                visit(child)
        order.append(module)

    visit(root)
    return order


@dataclass(frozen=True)
class _StateShape:
    """Optimizer state per parameter: bytes per element of the parameter's dtype, plus fixed
    bytes per parameter (scalars such as ``step``)."""

    per_element_bytes: int
    per_param_bytes: int


def _optimizer_state(
    optimizer: type[torch.optim.Optimizer] | torch.optim.Optimizer | None,
) -> Callable[[torch.dtype], _StateShape]:
    """A function from a parameter dtype to the state the optimizer keeps for it."""
    if optimizer is None:
        return lambda dtype: _StateShape(0, 0)
    if isinstance(optimizer, torch.optim.Optimizer):
        cls = type(optimizer)
        # `defaults` may hold keys the constructor does not take (AdamW's
        # `decoupled_weight_decay`): pass on only the constructor's own arguments.
        accepted = inspect.signature(cls).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    elif inspect.isclass(optimizer) and issubclass(optimizer, torch.optim.Optimizer):
        cls, defaults = optimizer, {}
    else:
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer class or instance, got {optimizer!r}"
        )
    return functools.lru_cache(maxsize=None)(functools.partial(_probe_state, cls, defaults))


def _probe_state(
    cls: type[torch.optim.Optimizer], defaults: dict[str, Any], dtype: torch.dtype
) -> _StateShape:
    """One step of the optimizer on a three-element parameter, read back: state tensors of the
    parameter's shape grow with it, the others are fixed per parameter."""
    param = torch.zeros(3, dtype=dtype, requires_grad=True)
    param.grad = torch.full_like(param, 0.5)
    opt = cls([param], **defaults)
    opt.step()
    per_element = per_param = 0
    for value in opt.state[param].values():
        if not isinstance(value, torch.Tensor):
            continue
        if value.shape == param.shape:
            per_element += value.element_size()
        else:
            per_param += value.numel() * value.element_size()
    return _StateShape(per_element, per_param)


def _compute_dtype(unit: _Unit) -> torch.dtype:
    """The dtype of the unit's parameters in forward and backward."""
    mp = unit.mixed_precision
    return (mp.param_dtype if mp is not None else None) or unit.params[0].dtype


def _plan(unit: _Unit, shard_world: int, use_orig_params: bool) -> FlatParamLayout:
    return plan_flat_param(
        [p.numel() for p in unit.params],
        _compute_dtype(unit).itemsize,
        shard_world,
        align_addresses=use_orig_params,
    )


def _unit_memory(
    unit: _Unit,
    layout: FlatParamLayout,
    rank: int,
    strategy: ShardingStrategy,
    use_orig_params: bool,
    state: Callable[[torch.dtype], _StateShape],
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
    ignored: set[nn.Module], state: Callable[[torch.dtype], _StateShape]
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
