"""Optimizer overlap for FSDP: each unit's shard is stepped as soon as its gradient is reduced.

torch's ``_OverlappedStandardOptimizer.register_fsdp`` raises ``NotImplementedError``. Here the
functional optimizer (``step_param``, one parameter at a time, the same arithmetic as the
``torch.optim`` class) runs in the unit's post-backward hook, right after the reduce-scatter
(or, for NO_SHARD, the all-reduce) of that unit, while autograd still computes the earlier
units' gradients. The gradient it steps with is the one ``.grad`` would hold after backward
(accumulated over ``no_sync`` iterations, divided, cast back), and every optimizer in
``torch.optim`` updates element by element, so the parameters are bit-identical to stepping
after backward. ``.grad`` is still set at the end of backward, as without overlap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._flat import FlatHandle
    from ._wrapper import FullyShardedDataParallel


def step_unit(unit: FullyShardedDataParallel, handle: FlatHandle) -> None:
    """Step the parameters of ``unit`` that the registered optimizer owns."""
    state = unit._overlapped_optim
    if state is None:
        return
    optimizer = state.functional_optimizer
    handle.finish_reduction()
    handle.wait_for_offload()
    only = getattr(state, "params_to_optimize", None)
    for param, grad in handle.params_and_grads():
        if grad is None or param.numel() == 0:
            continue
        if only is None or param in only:
            optimizer.step_param(param, grad)
