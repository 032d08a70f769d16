"""The gradient half of a flat handle: kept across backwards, reduced, offloaded, handed over.

Why the handle owns this: the reduce-scatter's padding and shard sizes are the layout's, the
shard kept from an earlier backward, the pinned host buffer and the copy in flight are the
handle's state, and with ``use_orig_params`` every step ends in the originals' gradient views.
The step hooks (``_runtime``) only decide *when* each step happens; *how* is here, as methods
of ``FlatHandle`` (this class is its base; the attributes it reads are set by the handle).

The arithmetic is torch's, step by step, so results are bit-identical: divide by the
pre-divide factor, reduce-scatter the padded unsharded gradient over the shard group (all-reduce
for NO_SHARD), all-reduce over the replicate group for hybrid strategies, divide by the
post-divide factor, and add to any gradient kept from an earlier backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ferrodist._exchange import chosen_for
from ferrodist.debug import _recorder

from ._collectives import (
    all_gather_flat,
    all_reduce,
    reduce_scatter_by_exchange,
    reduce_scatter_flat,
)

if TYPE_CHECKING:
    from ._layout import FlatParamLayout, ShardParamInfo


@dataclass(frozen=True)
class Reduction:
    """How a unit reduces its gradient: torch's divide factors, the replicate group of hybrid
    strategies (None otherwise), and a registered communication hook with its state."""

    predivide: float
    postdivide: float
    replicate_group: Optional[dist.ProcessGroup] = None
    hook: Optional[Callable[..., Any]] = None
    hook_state: Any = None


def _divide(tensor: torch.Tensor, factor: float) -> None:
    if factor > 1:
        tensor.div_(factor)


class FlatGrads:
    """Gradient methods of ``FlatHandle``; call ``_init_grads`` from its constructor."""

    # Set by FlatHandle.__init__; read here.
    flat_param: nn.Parameter
    local_shard: torch.Tensor
    layout: FlatParamLayout
    group: dist.ProcessGroup
    device: torch.device
    sharded: bool
    use_orig_params: bool
    orig_params: list[nn.Parameter]
    shard_infos: tuple[ShardParamInfo, ...]
    reduce_dtype: torch.dtype
    keep_low_precision_grads: bool
    offload_params: bool

    if TYPE_CHECKING:

        def unflat_views(self, tensor: torch.Tensor) -> list[torch.Tensor]: ...

    def _init_grads(self) -> None:
        self.saved_grad_shard: Optional[torch.Tensor] = None
        """The reduced shard, kept until the end of backward (and across ``no_sync``)."""
        self.post_backward_called = False
        self._cpu_grad: Optional[torch.Tensor] = None
        self._cpu_grad_arriving: Optional[torch.Tensor] = None
        self._add_on_arrival = False
        self._offload_in_flight = False
        self._reduction_in_flight: Optional[
            tuple[Any, torch.Tensor, Optional[torch.Tensor], float]
        ] = None
        """A reduce-scatter left running: (its work, the shard it fills, the chunks it receives
        when it is composed of an exchange, the post-divide still to apply)."""

    # ----- before and after the backward -----

    def prepare_grad_for_backward(self) -> None:
        """Move a reduced shard kept from an earlier step aside, so autograd starts a new
        unsharded gradient; the new reduced shard is added to it (gradient accumulation)."""
        flat = self.flat_param
        grad = flat.grad
        unsharded = torch.Size([self.layout.flat_numel])
        # A shard's gradient, or (CPU offload) any gradient on the host, cannot take autograd's
        # accumulation into the device-side unsharded gradient.
        if grad is not None and (grad.size() != unsharded or grad.device != flat.device):
            if grad.size() == self.local_shard.size():
                self.saved_grad_shard = grad.data
            flat.grad = None

    def finish_backward(self) -> None:
        """End of the whole backward: the reduced shard becomes ``flat_param.grad``."""
        if self.post_backward_called and self.saved_grad_shard is not None:
            self.flat_param.grad = self.saved_grad_shard
        self.saved_grad_shard = None
        self.post_backward_called = False

    # ----- reduction -----

    @torch.no_grad()
    def reduce_grad(self, reduction: Reduction) -> None:
        """Reduce the unsharded gradient autograd left in ``flat_param.grad``: the shard joins
        ``saved_grad_shard`` (sharded), or the gradient stays in place (NO_SHARD)."""
        grad = self.flat_param.grad
        assert grad is not None
        if grad.dtype != self.reduce_dtype and reduction.hook is None:
            grad.data = grad.to(self.reduce_dtype)
        self.finish_reduction()  # a unit reduced twice in one backward: in order
        if self.sharded:
            self._reduce_sharded(reduction)
        else:
            self._reduce_unsharded(reduction)
        if self.use_orig_params and self._reduction_in_flight is None:
            self.use_sharded_grad_views()

    def _reduce_sharded(self, reduction: Reduction) -> None:
        flat = self.flat_param
        assert flat.grad is not None
        unsharded = flat.grad.data
        flat.grad = None
        pad = self.layout.padded_unsharded_numel - unsharded.numel()
        padded = F.pad(unsharded, [0, pad]) if pad > 0 else unsharded
        shard = torch.empty(self.layout.shard_numel, dtype=unsharded.dtype, device=unsharded.device)
        if reduction.hook is None and reduction.replicate_group is None:
            _divide(padded, reduction.predivide)
            if chosen_for(self.group, padded):
                received = torch.empty_like(padded)
                work = reduce_scatter_by_exchange(received, padded, group=self.group, async_op=True)
            else:
                received = None
                work = reduce_scatter_flat(shard, padded, group=self.group, async_op=True)
            self._reduction_in_flight = (work, shard, received, reduction.postdivide)
            return
        if reduction.hook is None:
            _divide(padded, reduction.predivide)
            reduce_scatter_flat(shard, padded, group=self.group)
            assert reduction.replicate_group is not None
            # The replicas' all-reduce is the one that crosses hosts: left running under the
            # next unit's backward, as the reduce-scatter is above when there are no replicas.
            work = all_reduce(shard, group=reduction.replicate_group, async_op=True)
            self._reduction_in_flight = (work, shard, None, reduction.postdivide)
            return
        reduction.hook(reduction.hook_state, padded, shard)
        self._keep_reduced(shard)

    def finish_reduction(self) -> None:
        """Wait for the reduction ``reduce_grad`` left running (if any: the reduce-scatter, or
        under a hybrid strategy the replicas' all-reduce) and finish what follows it: the
        post-divide, the cast to the parameter's dtype, the offload, ``.grad``'s views. Called
        before the next unit's reduction is issued (so one runs under each unit's backward
        compute and at most one unsharded gradient waits), and before anything reads the
        reduced gradient: the end of backward, an overlapped optimizer's step."""
        pending = self._reduction_in_flight
        if pending is None:
            return
        self._reduction_in_flight = None
        work, shard, received, postdivide = pending
        work.wait()
        _recorder.waited(work)
        if received is not None:  # every rank's chunk for this one: summed in rank order
            rows = received.view(-1, shard.numel())
            shard.copy_(rows[0])
            for row in rows[1:]:
                shard.add_(row)
        _divide(shard, postdivide)
        if shard.dtype != self.flat_param.dtype:
            shard.data = shard.data.to(self.flat_param.dtype)
        self._keep_reduced(shard)
        if self.use_orig_params:
            self.use_sharded_grad_views()

    def _reduce_unsharded(self, reduction: Reduction) -> None:
        grad = self.flat_param.grad
        assert grad is not None
        if reduction.hook is None:
            _divide(grad, reduction.predivide)
            all_reduce(grad, group=self.group)
            _divide(grad, reduction.postdivide)
        else:
            reduction.hook(reduction.hook_state, grad)
        if not self.keep_low_precision_grads and grad.dtype != self.flat_param.dtype:
            grad.data = grad.data.to(self.flat_param.dtype)
        if self.offload_params:
            # The optimizer steps the host copy: the reduced gradient joins any kept from an
            # earlier backward there (torch's offload overwrites it instead).
            self.flat_param.grad = None
            self._keep_reduced(grad)

    # ----- CPU offload -----

    def _keep_reduced(self, grad: torch.Tensor) -> None:
        """``grad`` (reduced) becomes ``saved_grad_shard``, or is added to the one kept from an
        earlier backward; on the host under CPU offload.

        The copy to the host goes asynchronously into a pinned buffer reused step after step
        (what torch does too); ``wait_for_offload`` must run before anything reads the result.
        A kept gradient (``zero_grad(set_to_none=False)`` keeps one every step) may be that very
        buffer, so the new one lands in a second pinned buffer and is added to it on arrival:
        a synchronous copy into pageable memory there cost a 50M-parameter model 2.7x torch's
        step on an H100.
        """
        if not self.offload_params or grad.device == self.local_shard.device:
            saved = self.saved_grad_shard
            self.saved_grad_shard = grad if saved is None else saved.add_(grad)
            return
        self.wait_for_offload()  # an earlier copy into the same buffers must have landed
        if self.saved_grad_shard is None:
            self._cpu_grad = self._pinned_like(self._cpu_grad, grad)
            self._cpu_grad.copy_(grad, non_blocking=True)
            self.saved_grad_shard = self._cpu_grad
        else:
            self._cpu_grad_arriving = self._pinned_like(self._cpu_grad_arriving, grad)
            self._cpu_grad_arriving.copy_(grad, non_blocking=True)
            self._add_on_arrival = True
        self._offload_in_flight = True

    @staticmethod
    def _pinned_like(buffer: Optional[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
        return buffer

    def wait_for_offload(self) -> None:
        """Block until the asynchronous gradient copies to the host have landed (and a
        gradient kept from an earlier backward has had the new one added)."""
        if not self._offload_in_flight:
            return
        torch.cuda.current_stream(self.device).synchronize()
        self._offload_in_flight = False
        if self._add_on_arrival:
            self._add_on_arrival = False
            assert self.saved_grad_shard is not None and self._cpu_grad_arriving is not None
            self.saved_grad_shard.add_(self._cpu_grad_arriving)

    # ----- what others see -----

    def params_and_grads(self) -> list[tuple[torch.Tensor, Any]]:
        """What an optimizer stepping right after the reduction sees: the flat shard, or each
        original parameter's shard, with the gradient ``.grad`` will hold after backward."""
        flat = self.flat_param
        saved = self.saved_grad_shard
        grad = saved if self.sharded or saved is not None else flat.grad
        if not self.use_orig_params:
            return [(flat, grad)]
        self.use_sharded_grad_views()
        return [(p, p.grad) for p in self.orig_params if p.requires_grad]

    def unshard_grad(self) -> Optional[torch.Tensor]:
        """Gather the flat gradient (zeros where a rank has none) into ``flat_param.grad``;
        returns the shard to restore afterwards."""
        flat = self.flat_param
        saved = flat.grad
        if not self.sharded:
            if saved is not None and saved.device != flat.device:
                flat.grad = saved.to(flat.device)  # NO_SHARD under CPU offload
            return saved
        shard = saved if saved is not None else torch.zeros_like(self.local_shard)
        full = torch.empty(
            self.layout.padded_unsharded_numel, dtype=shard.dtype, device=self.device
        )
        all_gather_flat(full, shard.to(self.device).contiguous(), group=self.group)
        flat.grad = full[: self.layout.flat_numel]
        return saved

    # ----- use_orig_params: the originals' gradients -----

    @torch.no_grad()
    def unsharded_grad_views(self) -> None:
        """Each original's grad is a view of the unsharded flat grad, even while its data is
        a 1-D shard (``.grad.data`` skips autograd's shape check, as torch does)."""
        grad = self.flat_param.grad
        if grad is None:
            for param in self.orig_params:
                param.grad = None
            return
        for param, view in zip(self.orig_params, self.unflat_views(grad)):
            if param.shape != view.shape:
                if param.grad is None:
                    param.grad = torch.empty_like(param)
                param.grad.data = view
            else:
                param.grad = view

    @torch.no_grad()
    def use_sharded_grad_views(self) -> None:
        """Each original parameter's grad is its slice of the (reduced) gradient shard."""
        grad = self.saved_grad_shard if self.saved_grad_shard is not None else self.flat_param.grad
        if not self.sharded:
            views = self.unflat_views(grad) if grad is not None else None
            for index, param in enumerate(self.orig_params):
                param.grad = views[index] if views is not None and param.requires_grad else None
            return
        for param, info in zip(self.orig_params, self.shard_infos):
            if grad is None or not info.in_shard or not param.requires_grad:
                param.grad = None
            else:
                assert info.offset_in_shard is not None and info.numel_in_shard is not None
                param.grad = grad[
                    info.offset_in_shard : info.offset_in_shard + info.numel_in_shard
                ].reshape(param.shape)

    def grad_views_after_forward(self) -> None:
        """After a forward's reshard: the originals show a gradient accumulated unsharded under
        ``no_sync`` whole, any other as its slice of the shard."""
        grad = self.flat_param.grad
        if grad is not None and self.sharded and grad.numel() == self.layout.flat_numel:
            self.unsharded_grad_views()
        else:
            self.use_sharded_grad_views()

    def reset_flat_grad_if_orig_grads_none(self) -> None:
        """``zero_grad(set_to_none=True)`` on the originals frees the flat gradient too (the
        optimizer never sees ``flat_param``)."""
        if all(p.grad is None for p in self.orig_params):
            self.flat_param.grad = None
        self.flat_param.requires_grad_(any(p.requires_grad for p in self.orig_params))
