"""FSDP's flat-parameter layout, planned by the Rust core from element counts alone.

torch's ``FlatParamHandle`` concatenates a wrapped module's parameters into one flat parameter
(with alignment padding when ``use_orig_params=True``) and gives each rank an equal-sized shard
of it. :func:`plan_flat_param` computes the same layout without a tensor, so the runtime and
:func:`ferrodist.fsdp.estimate_memory` agree with each other and with torch. The rules are in
``rust/fsdp/layout.rs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ferrodist import _native


@dataclass(frozen=True)
class ShardParamInfo:
    """Where one original parameter lies in a rank's shard (torch's ``_ShardParamInfo``).

    ``flat_shard[offset_in_shard : offset_in_shard + numel_in_shard]`` holds
    ``param.flatten()[intra_param_start_idx : intra_param_end_idx + 1]``. The four indices are
    ``None`` when ``in_shard`` is false.
    """

    in_shard: bool
    offset_in_shard: int | None
    numel_in_shard: int | None
    intra_param_start_idx: int | None
    intra_param_end_idx: int | None  # inclusive, as torch


@dataclass(frozen=True)
class FlatParamLayout:
    """The layout of one flat parameter sharded over ``world_size`` ranks.

    Attributes:
        world_size: ranks the flat parameter is sharded over.
        numels: element count of each original parameter, in flattening order.
        param_offsets: where each original parameter starts in the unsharded flat parameter.
        numels_with_padding: parameters and padding segments in order (torch's
            ``_numels_with_padding``).
        is_padding_mask: true for the padding segments (torch's ``_is_padding_mask``).
        flat_numel: element count of the unsharded flat parameter torch builds (parameters plus
            alignment and world-size padding).
        shard_numel: element count of every rank's shard, end padding included (torch's
            ``_sharded_size``).
        padded_unsharded_numel: ``shard_numel * world_size``, the all-gather output's size.
    """

    world_size: int
    numels: tuple[int, ...]
    param_offsets: tuple[int, ...]
    numels_with_padding: tuple[int, ...]
    is_padding_mask: tuple[bool, ...]
    flat_numel: int
    shard_numel: int
    padded_unsharded_numel: int
    _plan: _native.FlatParamPlan = field(repr=False, compare=False)

    def shard_range(self, rank: int) -> tuple[int, int]:
        """``[start, end)`` of the flat parameter ``rank`` holds before its end padding."""
        return self._plan.shard_range(rank)

    def shard_padding(self, rank: int) -> int:
        """Elements ``rank`` pads at the end of its shard (torch's ``_shard_numel_padded``)."""
        return self._plan.shard_padding(rank)

    def shard_param_infos(self, rank: int) -> tuple[ShardParamInfo, ...]:
        """torch's ``_shard_param_infos`` for ``rank`` under a sharded strategy (one per
        original parameter)."""
        return tuple(ShardParamInfo(*info) for info in self._plan.shard_param_infos(rank))

    def unsharded_param_infos(self) -> tuple[ShardParamInfo, ...]:
        """torch's ``_shard_param_infos`` under ``NO_SHARD``: every rank keeps the whole flat
        parameter (plan it with the process group's size: its world-size padding still
        applies)."""
        return tuple(ShardParamInfo(*info) for info in self._plan.unsharded_param_infos())


def plan_flat_param(
    numels: Sequence[int], itemsize: int, world_size: int, *, align_addresses: bool
) -> FlatParamLayout:
    """Plan the flat parameter torch's FSDP builds for parameters of ``numels`` elements.

    Args:
        numels: element count of each parameter, in the order torch flattens them (the wrapped
            module's ``named_modules()`` walk, a shared parameter once).
        itemsize: bytes per element of the dtype the parameters have in forward and backward
            (``MixedPrecision.param_dtype`` if set); used for address alignment only.
        world_size: ranks of the sharding process group.
        align_addresses: torch aligns every parameter to 16 bytes and pads the flat parameter
            to a multiple of ``world_size`` exactly when ``use_orig_params=True``.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: no parameters, no elements at all, a negative numel, or an ``itemsize`` or
            ``world_size`` below 1 (the message names the argument).
    """
    plan = _native.plan_flat_param(numels, itemsize, world_size, align_addresses=align_addresses)
    return FlatParamLayout(
        world_size=plan.world_size,
        numels=tuple(plan.numels),
        param_offsets=tuple(plan.param_offsets),
        numels_with_padding=tuple(plan.numels_with_padding),
        is_padding_mask=tuple(plan.is_padding_mask),
        flat_numel=plan.flat_numel,
        shard_numel=plan.shard_numel,
        padded_unsharded_numel=plan.padded_unsharded_numel,
        _plan=plan,
    )
