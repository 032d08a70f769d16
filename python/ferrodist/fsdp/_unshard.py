"""Whole parameters outside the training step: ``summon_full_params`` and ``clip_grad_norm_``.

Why apart from the step hooks: these gather parameters (or reduce a norm) on the user's call, in
any state between steps, and must leave every unit exactly as sharded as they found it, writing
edits made to the gathered tensors back into each rank's shard.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Generator
from functools import reduce
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from ._shared import FLAT, is_unit, units_under

if TYPE_CHECKING:
    from ._wrapper import FullyShardedDataParallel


def _units(module: nn.Module, recurse: bool) -> list[FullyShardedDataParallel]:
    if recurse:
        return units_under(module)
    return [module] if is_unit(module) else []


@contextlib.contextmanager
def summon(
    module: nn.Module,
    recurse: bool = True,
    writeback: bool = True,
    rank0_only: bool = False,
    offload_to_cpu: bool = False,
    with_grads: bool = False,
) -> Generator[None, None, None]:
    """Gather every unit's parameters and register them whole, as torch's
    ``summon_full_params`` does; on exit write edits back (``writeback``) and reshard."""
    if writeback and rank0_only:
        raise ValueError(
            "writeback=True and rank0_only=True is not supported, as model parameter shapes "
            "will be different across ranks, and writing to them can lead to inconsistencies "
            "across ranks when the context is exited."
        )
    if offload_to_cpu and not rank0_only:
        warnings.warn(
            "offload_to_cpu=True and rank0_only=False may result in the"
            "unsharded parameters being redundantly copied to CPU memory for "
            "GPUs sharing the same CPU memory, which risks CPU OOM. We "
            "recommend using offload_to_cpu=True with rank0_only=True.",
            stacklevel=3,
        )
    units = _units(module, recurse)
    for unit in units:
        if unit._handle_state != "idle":
            raise AssertionError(
                "Expects the FSDP module to be in IDLE state for summon_full_params"
            )
    handles = [unit._handle for unit in units if unit._handle is not None]
    was_unsharded = [
        h.is_unsharded and h.padded_unsharded.untyped_storage().size() > 0 for h in handles
    ]
    for handle in handles:
        handle.unshard(full_precision=True)
    grads_saved = []
    if with_grads:
        for handle in handles:
            grads_saved.append(handle.unshard_grad())
    show = not rank0_only or dist.get_rank() == 0
    for unit in units:
        unit._summoning = True
    if show:
        for unit in units:
            own = unit._handle
            if own is not None and not own.use_orig_params:
                unit._fsdp_wrapped_module._parameters.pop(FLAT, None)
        for handle in handles:
            handle.use_unsharded_views(as_params=True)
            if with_grads and handle.flat_param.grad is not None:
                grad = handle.flat_param.grad
                for slot, view in zip(handle.slots, handle.unflat_views(grad)):
                    slot.module._parameters[slot.attr].grad = view  # type: ignore[union-attr]
    try:
        yield
    finally:
        for unit in units:
            unit._summoning = False
            own = unit._handle
            if own is not None and not own.use_orig_params:
                unit._fsdp_wrapped_module._parameters[FLAT] = own.flat_param
        for handle, was, saved in zip(handles, was_unsharded, grads_saved or [None] * len(handles)):
            if writeback and show:
                handle.write_back_unsharded()
            if with_grads:
                handle.flat_param.grad = None  # the gathered one; the shard comes back below
            if not was:
                handle.reshard(free=True)
            if with_grads:
                handle.flat_param.grad = saved
            if handle.use_orig_params:
                handle.use_sharded_views()
                if with_grads:
                    handle.use_sharded_grad_views()
            else:
                handle.hide_params()


def _grad_norm(grads: list[torch.Tensor], norm_type: float, device: torch.device) -> torch.Tensor:
    """The norm of ``grads`` where they are, moved to the compute device for the all-reduce
    (CPU-offloaded gradients live on the host)."""
    if not grads:
        return torch.tensor(0.0, dtype=torch.float32, device=device)
    norms = [torch.linalg.vector_norm(g.detach(), norm_type, dtype=torch.float32) for g in grads]
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type, dtype=torch.float32)
    return total.to(device)


def clip_grad_norm(
    root: FullyShardedDataParallel, max_norm: float, norm_type: float
) -> torch.Tensor:
    """torch's FSDP ``clip_grad_norm_``: per-gradient norms stacked, sharded ones all-reduced."""
    if not root.check_is_root():
        raise RuntimeError("`clip_grad_norm_()` should only be called on the root FSDP instance")
    if root._handle_state != "idle":
        raise AssertionError("clip_grad_norm_ expects the root to be in IDLE state")
    if all(unit._handle is None or not unit._handle.sharded for unit in root._all_units):
        # torch hands an all-NO_SHARD model to the plain clip (its parameter order differs).
        return torch.nn.utils.clip_grad_norm_(root.parameters(), max_norm, norm_type)
    sharded: list[torch.Tensor] = []
    nonsharded: list[torch.Tensor] = []
    grads: list[torch.Tensor] = []
    seen: set[int] = set()
    for unit in root._all_units:
        handle = unit._handle
        if handle is None:
            continue
        target = sharded if handle.sharded else nonsharded
        params = handle.orig_params if handle.use_orig_params else [handle.flat_param]
        for param in params:
            if id(param) in seen:
                continue
            seen.add(id(param))
            target.append(param)
            if param.grad is not None:
                grads.append(param.grad)
    for param in root.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            nonsharded.append(param)
            if param.grad is not None:
                grads.append(param.grad)
    device = root.compute_device
    local_sharded = _grad_norm([p.grad for p in sharded if p.grad is not None], norm_type, device)
    local_nonsharded = (
        _grad_norm([p.grad for p in nonsharded if p.grad is not None], norm_type, device)
        if nonsharded
        else None
    )
    if norm_type == math.inf:
        total = (
            torch.maximum(local_sharded, local_nonsharded)
            if local_nonsharded is not None
            else local_sharded
        )
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=root._group)
    else:
        total = local_sharded**norm_type
        dist.all_reduce(total, group=root._group)
        if local_nonsharded is not None:
            total += local_nonsharded**norm_type
        total = total ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(coef.to(grad.device, grad.dtype))
    if not grads:
        warnings.warn(
            f"Called FSDP.clip_grad_norm_() on rank {root.rank} with no gradients -- returning "
            f"the total norm in the default dtype {total.dtype}",
            stacklevel=3,
        )
        return total
    return total.to(reduce(torch.promote_types, [g.dtype for g in grads]))
