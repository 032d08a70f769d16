"""Delayed all-reduce (``delay_all_reduce_named_params`` / ``param_to_hook_all_reduce``).

The named parameters leave DDP's buckets. Their gradients live in one flat buffer (each
``.grad`` is a view of it, set again after every forward) and the buffer is averaged in a single
all-reduce started when the gradient of ``param_to_hook_all_reduce`` is computed, typically a
parameter whose gradient comes late in backward. As in torch, that all-reduce is asynchronous
and nobody waits for it: a later collective on the same group (or the next forward's) orders it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as tdist

from ferrodist._recorded_ops import collective
from ferrodist.ddp import module_sync

_all_reduce = collective("ddp.all_reduce", tdist.all_reduce, "tensor", "op")


class DelayedAllReduce:
    """The flat gradient buffer of the delayed parameters and the hook that reduces it."""

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        hook_param: torch.Tensor,
        process_group: Any,
        device: Optional[Any],
    ) -> None:
        self.params = list(params)
        self._process_group = process_group
        target = torch.device("cpu") if device is None else device
        self.buffer = torch.zeros(sum(p.numel() for p in self.params), device=target)
        module_sync.broadcast_tensors(process_group, [p.detach() for p in self.params], 0)
        hook_param.register_hook(self._reduce)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in self.params:
            self.views.append(self.buffer[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()

    def _reduce(self, grad: torch.Tensor) -> torch.Tensor:
        self.buffer.div_(tdist.get_world_size(self._process_group))
        _all_reduce(self.buffer, group=self._process_group, async_op=True)
        return grad

    def point_grads_at_buffer(self) -> None:
        """Make each missing ``.grad`` a zeroed view of the buffer (after every forward)."""
        all_none = all(p.grad is None for p in self.params)
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                p.grad = view
                if not all_none:
                    p.grad.zero_()
        if all_none:
            self.buffer.zero_()
