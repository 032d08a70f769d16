"""The training-step hooks of FSDP: unshard before use, reshard after, reduce gradients.

Why hooks on tensors and on ``AccumulateGrad``: the unit's forward knows when its parameters
are needed, but the backward order is autograd's. So, as torch does,

* the pre-forward all-gathers the unit's flat parameter and installs the views;
* the post-forward reshards it (FULL_SHARD / HYBRID_SHARD free the unsharded storage; the root
  keeps it, since its backward starts right away) and hooks every output tensor that needs a
  gradient, so the first gradient reaching the unit re-gathers the parameters (pre-backward);
* a hook on the flat parameter's ``AccumulateGrad`` node runs once its whole unsharded gradient
  is ready (post-backward): it reshards and reduces the gradient;
* a callback queued on autograd's engine at the first pre-backward of the root runs once the
  whole backward is done: it hands each unit's reduced shard to ``.grad`` for the optimizer.

These hooks decide *when* each step runs and with which of the unit's settings; the flat handle
does the tensor work (``_flat`` for the shards and views, ``_flat_grad`` for the gradient's
reduction, offload and hand-over, with torch's arithmetic).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.autograd import Variable
from torch.distributed.fsdp import ShardingStrategy

from . import _prefetch
from ._flat_grad import Reduction
from ._overlap import step_unit
from ._shared import HYBRID, units_under

if TYPE_CHECKING:
    from ._flat import FlatHandle
    from ._wrapper import FullyShardedDataParallel

RESHARD_AFTER_FORWARD = (ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD)


def predivide_factor(world_size: int) -> float:
    """torch's pre-divide factor: the largest power of two ``f`` with ``f * f <= world_size``
    dividing it, so neither division alone under- or overflows in low precision."""
    factor = 1
    while world_size % factor == 0 and world_size / factor > factor:
        factor *= 2
    return float(factor)


# ----- forward -----


def pre_forward(unit: FullyShardedDataParallel) -> None:
    """Unshard the unit's parameters and hook its ``AccumulateGrad`` for the backward."""
    handle = unit._handle
    if handle is None:
        return
    unit._handle_state = "forward"
    _prefetch.record(unit)
    handle.unshard(by_runtime=True)
    _prefetch.forward(unit)
    handle.use_unsharded_views(as_params=False)
    if torch.is_grad_enabled():
        _register_post_backward_hook(unit, handle)


def post_forward(unit: FullyShardedDataParallel, output: Any) -> Any:
    """Reshard (unless root or a no-reshard strategy) and hook the outputs for the backward."""
    handle = unit._handle
    if handle is not None:
        free = not unit._is_root and unit.sharding_strategy in RESHARD_AFTER_FORWARD
        _reshard(unit, handle, free, in_forward=True)
    _prefetch.after_forward(unit)
    if torch.is_grad_enabled():
        unit._ran_pre_backward = False
        if unit._is_root:
            unit._final_callback_queued = False
        hook = functools.partial(_pre_backward_hook, unit)
        _for_each_tensor(output, lambda t: t.register_hook(hook) if t.requires_grad else None)
    unit._handle_state = "idle"
    return output


def _for_each_tensor(obj: Any, fn: Any) -> None:
    if isinstance(obj, torch.Tensor):
        fn(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _for_each_tensor(item, fn)
    elif isinstance(obj, dict):
        for item in obj.values():
            _for_each_tensor(item, fn)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            _for_each_tensor(getattr(obj, name), fn)


def _reshard(
    unit: FullyShardedDataParallel, handle: FlatHandle, free: bool, in_forward: bool = False
) -> None:
    handle.reshard(free)
    if not handle.use_orig_params:
        return
    keep_views = (
        in_forward
        and torch.is_grad_enabled()
        and unit.sharding_strategy not in RESHARD_AFTER_FORWARD
        and handle.sharded
    )
    if not keep_views:
        handle.use_sharded_views()
        if in_forward:
            handle.grad_views_after_forward()


# ----- backward -----


def _pre_backward_hook(unit: FullyShardedDataParallel, grad: torch.Tensor) -> torch.Tensor:
    if unit._ran_pre_backward:
        return grad
    if unit._is_root and not unit._final_callback_queued:
        unit._final_callback_queued = True
        Variable._execution_engine.queue_callback(functools.partial(_final_callback, unit))
        for other in unit._all_units:
            if other._handle is not None and other._handle.use_orig_params:
                other._handle.reset_flat_grad_if_orig_grads_none()
    handle = unit._handle
    if handle is not None:
        unit._handle_state = "backward_pre"
        handle.unshard(by_runtime=True)
        _prefetch.backward(unit)
        handle.use_unsharded_views(as_params=False)
        handle.prepare_grad_for_backward()
    unit._ran_pre_backward = True
    return grad


def _register_post_backward_hook(unit: FullyShardedDataParallel, handle: FlatHandle) -> None:
    flat = handle.flat_param
    if unit._post_backward_hook is not None or not flat.requires_grad:
        return
    grad_fn = flat.expand_as(flat).grad_fn
    assert grad_fn is not None
    accumulate = grad_fn.next_functions[0][0]
    assert accumulate is not None
    hook = accumulate.register_hook(functools.partial(_post_backward_hook, unit, handle))
    unit._post_backward_hook = (accumulate, hook)


@torch.no_grad()
def _post_backward_hook(unit: FullyShardedDataParallel, handle: FlatHandle, *_: Any) -> None:
    flat = handle.flat_param
    handle.post_backward_called = True
    unit._handle_state = "backward_post"
    if flat.grad is None:
        return
    if flat.grad.requires_grad:
        raise RuntimeError("FSDP does not support gradients of gradients")
    _prefetch.after_backward(unit)
    free = handle.sharded and (
        unit._sync_gradients or unit.sharding_strategy in RESHARD_AFTER_FORWARD
    )
    _reshard(unit, handle, free)
    if not unit._sync_gradients:
        if handle.use_orig_params:
            handle.unsharded_grad_views()
        return
    root = unit._root if unit._root is not None else unit
    _finish_reductions(root)
    handle.reduce_grad(_reduction(unit))
    if handle._reduction_in_flight is not None:
        root._reductions_in_flight.append(handle)
    if unit._overlapped_optim is not None:
        step_unit(unit, handle)


def _finish_reductions(root: FullyShardedDataParallel) -> None:
    """Finish the reductions left running by earlier post-backwards (see ``finish_reduction``)."""
    pending = root._reductions_in_flight
    while pending:
        pending.pop(0).finish_reduction()


def _reduction(unit: FullyShardedDataParallel) -> Reduction:
    """The unit's settings its handle reduces the gradient with."""
    return Reduction(
        unit._predivide,
        unit._postdivide,
        unit._inter_group if unit.sharding_strategy in HYBRID else None,
        unit._comm_hook,
        unit._comm_hook_state,
    )


def _final_callback(root: FullyShardedDataParallel) -> None:
    """After the whole backward: reshard what is left, hand reduced shards to ``.grad``."""
    _prefetch.drop_unused(root)
    _finish_reductions(root)
    for unit in root._all_units:
        handle = unit._handle
        unit._handle_state = "idle"
        unit._ran_pre_backward = False
        if handle is None:
            continue
        handle.wait_for_offload()
        if handle.needs_reshard:  # still gathered: a unit whose gradient never came
            _reshard(unit, handle, free=True)
        if unit._post_backward_hook is not None:
            unit._post_backward_hook[1].remove()
            unit._post_backward_hook = None
        if not handle.flat_param.requires_grad or not root._sync_gradients:
            continue
        handle.finish_backward()
    root._final_callback_queued = False


def lazy_init_root(root: FullyShardedDataParallel) -> None:
    """First forward of the outermost unit: it becomes the root of every unit below it."""
    units = units_under(root)
    for unit in units:
        unit._is_root = unit is root
        unit._all_units = units if unit is root else []
        object.__setattr__(unit, "_root", root)  # a reference, not a registered submodule
    cast_buffers(root)


def _map_tensors(fn: Any, obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_map_tensors(fn, item) for item in obj)
    if isinstance(obj, list):
        return [_map_tensors(fn, item) for item in obj]
    if isinstance(obj, dict):
        return {key: _map_tensors(fn, item) for key, item in obj.items()}
    return obj


def cast_inputs(dtype: Optional[torch.dtype], obj: Any) -> Any:
    """``obj`` with every floating-point tensor cast to ``dtype`` (torch's input casting)."""
    if dtype is None:
        return obj
    return _map_tensors(
        lambda t: t.to(dtype) if torch.is_floating_point(t) and t.dtype != dtype else t, obj
    )


def move_inputs(device: torch.device, obj: Any) -> Any:
    """``obj`` with every tensor on the compute device: the root moves its inputs there, as
    torch's does, so a CPU batch feeds a GPU (or CPU-offloaded) model unchanged."""
    if device.type == "cpu":
        return obj
    return _map_tensors(lambda t: t.to(device, non_blocking=True), obj)


def cast_buffers(root: FullyShardedDataParallel) -> None:
    """Mixed precision: floating buffers take the buffer dtype of the innermost unit holding
    them, once, at the root's first forward (as torch does)."""
    seen: set[int] = set()
    for unit in reversed(root._all_units):
        dtype = unit.mixed_precision.buffer_dtype
        for buffer in unit.buffers():
            if id(buffer) in seen:
                continue
            seen.add(id(buffer))
            if dtype is not None and torch.is_floating_point(buffer):
                buffer._fsdp_orig_dtype = buffer.dtype  # type: ignore[attr-defined]
                buffer.data = buffer.to(dtype=dtype)


def root_pre_forward(root: FullyShardedDataParallel) -> None:
    """The root's extra step: with ``use_orig_params``, ``zero_grad`` on the originals frees
    the flat gradients before a new forward."""
    for unit in root._all_units:
        handle: Optional[FlatHandle] = unit._handle
        if handle is not None and handle.use_orig_params:
            handle.reset_flat_grad_if_orig_grads_none()
