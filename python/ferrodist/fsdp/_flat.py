"""One FSDP unit's flat parameter: the shard a rank keeps, the unsharded buffer, the views.

Why a flat parameter: a wrapped unit's parameters are concatenated into one 1-D tensor so that
a unit costs one all-gather and one reduce-scatter, whatever its number of tensors. The layout
(which element goes where, the alignment and end padding, each rank's range) is planned once in
Rust (``_layout.plan_flat_param``); this module only moves tensors according to it.

The memory model is torch's, since torch's checkpoints, optimizer states and numbers must match
ours bit for bit:

* ``flat_param`` is one ``nn.Parameter``. While sharded its data is this rank's padded shard
  (what the optimizer steps); while unsharded its data is the first ``flat_numel`` elements of
  the padded unsharded buffer, so the views the forward uses are views of the parameter and
  autograd accumulates one unsharded gradient into ``flat_param.grad``.
* The padded unsharded buffer is one tensor whose *storage* is freed (resized to 0) on reshard
  and re-grown on unshard: the tensors autograd saved in the forward are views of that storage,
  so the all-gather in the pre-backward refills exactly what the backward reads.
* Alignment padding (``use_orig_params=True``) holds torch's marker value 42; the end padding a
  shard needs is zeros. Neither is ever read by a computation, but both are stepped by the
  optimizer, so matching them keeps flat optimizer states equal to torch's.

What happens to ``flat_param.grad`` after autograd (reduce, offload, hand-over to ``.grad``) is
the handle's too: its base ``FlatGrads`` (``_flat_grad``) holds that half.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ._collectives import all_gather_flat, runtime_all_gather_flat
from ._flat_grad import FlatGrads
from ._layout import FlatParamLayout, ShardParamInfo, plan_flat_param

PADDING_VALUE = 42.0
"""The value torch writes into alignment padding (visible in flat optimizer states)."""


@dataclass(frozen=True)
class ParamSlot:
    """Where one original parameter lives: its module, attribute name and name in the unit."""

    module: nn.Module
    attr: str
    fqn: str
    shape: torch.Size


class FlatHandle(FlatGrads):
    """The flat parameter of one wrapped unit and its shard/unshard transitions (its gradient's
    reduction and offload are the methods of ``FlatGrads``)."""

    def __init__(
        self,
        slots: list[ParamSlot],
        params: list[nn.Parameter],
        group: dist.ProcessGroup,
        sharded: bool,
        use_orig_params: bool,
        param_dtype: Optional[torch.dtype] = None,
        reduce_dtype: Optional[torch.dtype] = None,
        keep_low_precision_grads: bool = False,
        offload_params: bool = False,
        shared_slots: Optional[list[tuple[ParamSlot, int]]] = None,
    ) -> None:
        self.slots = slots
        self.shared_slots = shared_slots or []
        self.orig_params = params
        self.group = group
        self.rank = group.rank()
        self.world_size = group.size()
        self.sharded = sharded
        self.use_orig_params = use_orig_params
        dtype = params[0].dtype
        # torch's mixed-precision rule: a param_dtype alone also sets the reduce dtype.
        self.compute_dtype = param_dtype or dtype
        if param_dtype is not None and reduce_dtype is None:
            self.reduce_dtype = param_dtype
        else:
            self.reduce_dtype = reduce_dtype or dtype
        self.mixed_params = self.compute_dtype != dtype
        self.keep_low_precision_grads = keep_low_precision_grads
        self.layout: FlatParamLayout = plan_flat_param(
            [p.numel() for p in params],
            torch.empty((), dtype=self.compute_dtype).element_size(),
            self.world_size,
            align_addresses=use_orig_params,
        )
        self.shard_infos: tuple[ShardParamInfo, ...] = (
            self.layout.shard_param_infos(self.rank)
            if sharded
            else self.layout.unsharded_param_infos()
        )
        flat = self._flatten([p.detach() for p in params], dtype)
        requires_grad = any(p.requires_grad for p in params)
        if sharded:
            start, end = self.layout.shard_range(self.rank)
            local = flat[start:end].clone()
            pad = self.layout.shard_padding(self.rank)
            if pad > 0:
                local = F.pad(local, [0, pad])
        else:
            local = flat
        # The compute device is where the parameters were built; with CPU offload the shard
        # (what the optimizer steps) lives on the host, pinned so the copies can overlap.
        self.device = local.device
        self.offload_params = offload_params
        if offload_params and local.device.type != "cpu":
            local = local.cpu().pin_memory()
        self.local_shard: torch.Tensor = local
        self.flat_param = nn.Parameter(local, requires_grad=requires_grad)
        self.padded_unsharded = torch.empty(
            self.layout.padded_unsharded_numel, dtype=self.compute_dtype, device=self.device
        )
        self._free(self.padded_unsharded)
        # Mixed precision: summon_full_params and state dicts gather the full-precision shards.
        self.padded_full_precision = torch.empty(
            self.layout.padded_unsharded_numel if self.mixed_params else 0,
            dtype=dtype,
            device=self.device,
        )
        self._free(self.padded_full_precision)
        self._unsharded = not sharded
        self._prefetch: Optional[tuple[torch.Tensor, Any, torch.Tensor]] = None
        """An all-gather issued ahead of use: (buffer it fills, its work, its input)."""
        self._init_grads()
        if not use_orig_params:
            # The originals are replaced by views of ``flat_param``: holding them here would
            # keep the whole unsharded model alive on every rank.
            self.orig_params = []

    # ----- building -----

    def _flatten(self, tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The unsharded flat tensor: parameters and alignment padding, in layout order."""
        pieces: list[torch.Tensor] = []
        it = iter(tensors)
        device = tensors[0].device
        for numel, is_pad in zip(self.layout.numels_with_padding, self.layout.is_padding_mask):
            if is_pad:
                pieces.append(torch.full((numel,), PADDING_VALUE, dtype=dtype, device=device))
            else:
                pieces.append(next(it).reshape(-1))
        return torch.cat(pieces)

    # ----- storage -----

    @staticmethod
    def _free(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.size() != 0:
            storage.resize_(0)

    @staticmethod
    def _alloc(tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        nbytes = tensor.numel() * tensor.element_size()
        if storage.size() != nbytes:
            storage.resize_(nbytes)

    @property
    def is_unsharded(self) -> bool:
        """Whether ``flat_param`` currently holds the whole (unpadded) flat parameter."""
        return self._unsharded

    @property
    def needs_reshard(self) -> bool:
        """Whether ``flat_param`` points at something other than the local shard: gathered
        (sharded), or a device copy of a host shard (NO_SHARD under CPU offload)."""
        if self.sharded and self._unsharded:
            return True
        return self.offload_params and self.flat_param.device != self.local_shard.device

    # ----- transitions -----

    def unshard(self, full_precision: bool = False, by_runtime: bool = False) -> None:
        """All-gather the shards into the padded buffer (if it was freed) and point at it.

        With parameter mixed precision the shard is cast first and the buffer is in the compute
        dtype, unless ``full_precision`` (summon, state dicts) asks for the original dtype.
        ``by_runtime``: called by a unit's forward or backward hook (the runtime's gather).
        """
        low = self.mixed_params and not full_precision
        if not self.sharded:
            self.flat_param.data = self._shard_on_device(low)
            return
        buffer = (
            self.padded_unsharded if not self.mixed_params or low else self.padded_full_precision
        )
        self.finish_prefetch()
        if buffer.untyped_storage().size() == 0:
            self._alloc(buffer)
            gather = runtime_all_gather_flat if by_runtime else all_gather_flat
            gather(buffer, self._shard_on_device(low), group=self.group)
        self.flat_param.data = buffer[: self.layout.flat_numel]
        self._unsharded = True

    def prefetch(self) -> bool:
        """Issue the all-gather the next ``unshard`` needs, asynchronously, so that it runs on
        the backend while this rank computes something else; True if one was issued. Nothing
        reads the buffer before ``unshard`` (or ``finish_prefetch``) has waited for it; what
        arrives is what the synchronous all-gather would have written, bit for bit."""
        if not self.sharded or self._prefetch is not None or self._unsharded:
            return False
        buffer = self.padded_unsharded
        if buffer.untyped_storage().size() != 0:
            return False  # still gathered (a strategy that keeps it between forward and backward)
        self._alloc(buffer)
        shard = self._shard_on_device(self.mixed_params)
        work = runtime_all_gather_flat(buffer, shard, group=self.group, async_op=True)
        self._prefetch = (buffer, work, shard)
        return True

    def finish_prefetch(self) -> None:
        """Wait for an all-gather issued by ``prefetch``, if any (its buffer stays filled)."""
        pending = self._prefetch
        if pending is None:
            return
        self._prefetch = None
        pending[1].wait()

    def drop_prefetch(self) -> None:
        """A prefetched gather that nothing used this step: wait for it, free its buffer."""
        if self._prefetch is not None and not self._unsharded:
            self.finish_prefetch()
            self._free(self.padded_unsharded)

    def _shard_on_device(self, low_precision: bool) -> torch.Tensor:
        """The local shard on the compute device (copied from the host under CPU offload),
        in the compute dtype when ``low_precision``: moved first, then cast, as torch does."""
        shard = self.local_shard.to(self.device, non_blocking=True)
        return shard.to(self.compute_dtype) if low_precision else shard

    def reshard(self, free: bool) -> None:
        """Point ``flat_param`` back at the shard; with ``free``, drop the unsharded storage."""
        self.finish_prefetch()  # a gather must not write into storage being freed
        self.flat_param.data = self.local_shard
        if not self.sharded:
            return
        self._unsharded = False
        self._free(self.padded_full_precision)
        if free:
            self._free(self.padded_unsharded)

    def write_back_unsharded(self) -> None:
        """Copy this rank's range of the unsharded buffer into its shard (after edits to it)."""
        if not self.sharded:
            # NO_SHARD under CPU offload computes on a device copy of the host shard.
            if self.flat_param.data.data_ptr() != self.local_shard.data_ptr():
                with torch.no_grad():
                    self.local_shard.copy_(self.flat_param.data)
            return
        buffer = self.padded_full_precision if self.mixed_params else self.padded_unsharded
        if buffer.untyped_storage().size() == 0:
            return
        start = self.rank * self.layout.shard_numel
        with torch.no_grad():
            self.local_shard.copy_(buffer[start : start + self.layout.shard_numel])

    # ----- views -----

    def unflat_views(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Views of an unsharded flat ``tensor`` in each original parameter's shape."""
        pieces = torch.split(tensor, list(self.layout.numels_with_padding))
        out = []
        for piece, is_pad in zip(pieces, self.layout.is_padding_mask):
            if not is_pad:
                out.append(piece)
        return [piece.view(slot.shape) for piece, slot in zip(out, self.slots)]

    def use_unsharded_views(self, as_params: bool) -> None:
        """Make each module attribute a view of the unsharded ``flat_param``.

        With ``as_params`` the attributes are registered parameters (the original objects when
        ``use_orig_params``, new ones otherwise), as named_parameters shows them; without, they
        are plain tensors, so the forward's autograd graph leads back to ``flat_param``.
        """
        with torch.enable_grad():
            views = self.unflat_views(self.flat_param)
        shown: list[torch.Tensor] = []
        for index, (slot, view) in enumerate(zip(self.slots, views)):
            module = slot.module
            if as_params:
                if self.use_orig_params:
                    param = self.orig_params[index]
                    param.data = view.detach()
                else:
                    param = nn.Parameter(view.detach(), requires_grad=self.flat_param.requires_grad)
                module.__dict__.pop(slot.attr, None)
                module._parameters[slot.attr] = param
                shown.append(param)
            else:
                module._parameters.pop(slot.attr, None)
                module.__dict__[slot.attr] = view
                shown.append(view)
        for slot, primary in self.shared_slots:
            self._show(slot, shown[primary], as_param=as_params)

    @staticmethod
    def _show(slot: ParamSlot, tensor: torch.Tensor, as_param: bool) -> None:
        """Put ``tensor`` at ``slot``: a registered parameter, or a plain attribute."""
        if as_param:
            slot.module.__dict__.pop(slot.attr, None)
            slot.module._parameters[slot.attr] = tensor  # type: ignore[assignment]
        else:
            slot.module._parameters.pop(slot.attr, None)
            slot.module.__dict__[slot.attr] = tensor

    def hide_params(self) -> None:
        """``use_orig_params=False`` between steps: the originals are no registered parameters,
        only empty tensor attributes (so ``module.weight`` and the module's repr still work)."""
        placeholder = self.local_shard.new_empty(0)
        for slot in self.slots + [shared for shared, _ in self.shared_slots]:
            slot.module._parameters.pop(slot.attr, None)
            slot.module.__dict__[slot.attr] = placeholder

    @torch.no_grad()
    def use_sharded_views(self) -> None:
        """``use_orig_params=True``: each original parameter's data is its slice of the shard."""
        if not self.sharded:
            self.use_unsharded_views(as_params=True)
            return
        empty = self.flat_param.new_empty(0)
        for param, info, slot in zip(self.orig_params, self.shard_infos, self.slots):
            slot.module.__dict__.pop(slot.attr, None)
            slot.module._parameters[slot.attr] = param
            if info.in_shard:
                assert info.offset_in_shard is not None and info.numel_in_shard is not None
                param.data = self.flat_param[
                    info.offset_in_shard : info.offset_in_shard + info.numel_in_shard
                ]
            else:
                param.data = empty
        for slot, primary in self.shared_slots:
            self._show(slot, self.orig_params[primary], as_param=True)

    def full_flat(self) -> torch.Tensor:
        """The unpadded unsharded flat tensor (the handle must be unsharded)."""
        return self.flat_param.data[: self.layout.flat_numel]

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's padded shard of an unsharded flat tensor laid out like ``flat_param``."""
        if not self.sharded:
            return flat
        start, end = self.layout.shard_range(self.rank)
        shard = flat[start:end]
        pad = self.layout.shard_padding(self.rank)
        return F.pad(shard, [0, pad]) if pad > 0 else shard

    def flatten_full(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Unsharded flat tensor from one full tensor per original parameter (for loading)."""
        return self._flatten([t.detach() for t in tensors], self.local_shard.dtype)
