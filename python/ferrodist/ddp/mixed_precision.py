"""DDP mixed precision (torch's private ``_MixedPrecision``): low-precision compute and
communication, full-precision weights for the optimizer and for checkpoints.

torch's version records copy events on an accelerator stream, so on a machine without CUDA its
``DistributedDataParallel(..., mixed_precision=...)`` fails with a CUDA error. ferrodist does the
same casts synchronously, on any device, with torch's arithmetic:

- at construction, floating-point buffers become ``buffer_dtype`` for good;
- when the wrapped module is called, every parameter's data becomes a ``param_dtype`` copy of
  its full-precision tensor (an accumulated ``.grad`` is cast down too), and floating-point
  inputs are cast to ``param_dtype``;
- the Reducer's buckets hold ``param_dtype`` gradients; the communication hook registered here
  (so a user hook is refused afterwards, as in torch) casts a bucket to ``reduce_dtype``, sums
  it across ranks and divides by the world size;
- at the end of a synchronising backward every parameter is put back on its full-precision
  tensor and its ``.grad`` cast up, before the reduced values are written into it: the
  optimizer steps in full precision.

Where ferrodist differs on purpose: only floating-point buffers are cast (torch also casts
integer buffers such as BatchNorm's ``num_batches_tracked``, against its own documentation), and
a forward with gradients disabled puts the full-precision parameters back right away (torch
leaves them in low precision until the next backward, so a ``state_dict()`` taken after
evaluation would hold the low-precision copies).

The annotations are real objects (no ``from __future__ import annotations``): the comm-hook
check reads the hook's ``bucket`` annotation at registration.
"""

from typing import Any, Optional

import torch
from torch.utils._pytree import tree_map_only

from ferrodist.ddp.comm_hook import allreduce_sum_future
from ferrodist.ddp.grad_bucket import GradBucket

_FIELDS = ("param_dtype", "reduce_dtype", "buffer_dtype")


def check_config(config: Any) -> None:
    """Refuse anything that is not a ``_MixedPrecision``-like config, naming the argument."""
    for name in _FIELDS:
        if not hasattr(config, name):
            raise TypeError(
                "mixed_precision must be a torch.nn.parallel.distributed._MixedPrecision "
                f"(with {', '.join(_FIELDS)}), got {type(config).__name__}"
            )
        value = getattr(config, name)
        if value is not None and not isinstance(value, torch.dtype):
            raise TypeError(f"mixed_precision.{name} must be a torch.dtype or None, got {value!r}")


class MixedPrecisionCasts:
    """The parameters' two precisions and the switches between them."""

    def __init__(self, config: Any, named_params: list[tuple[str, torch.nn.Parameter]]) -> None:
        check_config(config)
        self.param_dtype: Optional[torch.dtype] = config.param_dtype
        self.reduce_dtype: Optional[torch.dtype] = config.reduce_dtype
        self.buffer_dtype: Optional[torch.dtype] = config.buffer_dtype
        self._params = [p for _, p in named_params]
        self._full: list[torch.Tensor] = [p.data for p in self._params]
        self._low = [False] * len(self._params)

    def cast_buffers(self, buffers: list[torch.Tensor]) -> None:
        """Turn floating-point buffers into ``buffer_dtype`` (once, at construction)."""
        if self.buffer_dtype is None:
            return
        for buf in buffers:
            if buf.is_floating_point():
                buf.data = buf.data.to(self.buffer_dtype)

    def cast_inputs(self, inputs: Any, kwargs: Any) -> tuple[Any, Any]:
        """Floating-point tensors in the forward arguments, cast to ``param_dtype``."""
        dtype = self.param_dtype
        if dtype is None:
            return inputs, kwargs

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t

        return tree_map_only(torch.Tensor, cast, (inputs, kwargs))  # type: ignore[no-any-return]

    def to_low_precision(self) -> None:
        """Point every parameter at a fresh ``param_dtype`` copy of its full-precision tensor."""
        with torch.no_grad():
            for i, p in enumerate(self._params):
                if self._low[i] or self.param_dtype in (None, p.dtype):
                    continue  # still low since the last forward (no synchronising backward)
                self._full[i] = p.data
                p.data = p.data.to(self.param_dtype, copy=True)
                if p.grad is not None:
                    p.grad.data = p.grad.data.to(self.param_dtype)
                self._low[i] = True

    def to_full_precision(self) -> None:
        """Put every parameter back on its full-precision tensor, with its ``.grad`` cast up."""
        with torch.no_grad():
            for i, p in enumerate(self._params):
                if not self._low[i]:
                    continue
                full = self._full[i]
                p.data = full
                if p.grad is not None and p.grad.dtype != full.dtype:
                    p.grad.data = p.grad.data.to(full.dtype)
                self._low[i] = False

    def forward_pre_hook(self, _module: Any, args: Any, kwargs: Any) -> None:
        """Registered on the wrapped module: every call computes in ``param_dtype``."""
        self.to_low_precision()

    def reduce_dtype_for(self, bucket_dtype: torch.dtype) -> torch.dtype:
        """The dtype a bucket is summed in: ``reduce_dtype``, else the bucket's own."""
        return self.reduce_dtype if self.reduce_dtype is not None else bucket_dtype


def _reducer_allreduce_and_upcast_hook(
    state: tuple[MixedPrecisionCasts, Any], bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Sum a bucket in ``reduce_dtype`` and divide it by the world size (torch's hook name).

    The parameters go back to full precision at the end of backward (the Reducer calls
    ``MixedPrecisionCasts.to_full_precision`` before writing the results into ``.grad``).
    """
    casts, process_group = state
    buffer = bucket.buffer()
    target = casts.reduce_dtype_for(buffer.dtype)
    if buffer.dtype != target:
        bucket.set_buffer(buffer.to(target))
    world = process_group.size()

    def divide(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        reduced = fut.value()
        return reduced.div_(world)

    return allreduce_sum_future(process_group, bucket.buffer()).then(divide)
