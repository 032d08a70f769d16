"""The pass-through node DDP puts on its outputs when it must see the end of backward.

With ``find_unused_parameters`` outputs that do not feed the loss still get an (undefined)
gradient through this node; with ``static_graph`` its backward is where the first iteration
queues the Reducer's single all-at-the-end reduction.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ferrodist.ddp.reducer import _engine_callback


class _DDPSink(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ddp_ref: Callable[[], Any], *inputs: Any) -> Any:
        ctx.set_materialize_grads(False)
        ctx.ddp_ref = ddp_ref
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        ddp = ctx.ddp_ref()
        if ddp is not None and ddp.static_graph and not ddp._static_graph_delay_allreduce_enqueued:
            _engine_callback(ddp.reducer._delay_all_reduce)
            ddp._static_graph_delay_allreduce_enqueued = True
        return (None, *grad_outputs)


def _flatten(obj: Any, out: list[torch.Tensor]) -> Any:
    """Replace each tensor with its position in ``out``; return the structure."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        return _Slot(len(out) - 1)
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_flatten(o, out) for o in obj)
    if isinstance(obj, dict):
        return {k: _flatten(v, out) for k, v in obj.items()}
    return obj


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index


def _unflatten(obj: Any, values: list[torch.Tensor]) -> Any:
    if isinstance(obj, _Slot):
        return values[obj.index]
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unflatten(o, values) for o in obj)
    if isinstance(obj, dict):
        return {k: _unflatten(v, values) for k, v in obj.items()}
    return obj


def pass_through_sink(ddp_ref: Callable[[], Any], output: Any) -> Any:
    """``output`` with every tensor that has a ``grad_fn`` routed through ``_DDPSink``."""
    tensors: list[torch.Tensor] = []
    shape = _flatten(output, tensors)
    if not tensors:
        return output
    passed = _DDPSink.apply(ddp_ref, *tensors)
    values = [t if t.grad_fn is None else p for t, p in zip(tensors, passed)]
    return _unflatten(shape, values)
