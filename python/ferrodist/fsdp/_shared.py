"""The names every part of ``ferrodist.fsdp`` shares: torch's key segments, what a unit is.

Why a module of its own, at the bottom: the runtime, the state dicts, the optimizer state dicts
and the wrapper all need torch's segment names (``_fsdp_wrapped_module``, ``_flat_param``), the
hybrid strategies, and a way to find the FSDP units in a module tree. Kept here, none of them
needs the wrapper class itself, so the wrapper depends on its parts and never the other way
round. ``UnitBase`` is the class units are recognised by (the wrapper subclasses it); it adds
nothing to ``nn.Module``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.fsdp import ShardingStrategy

if TYPE_CHECKING:
    from typing_extensions import TypeGuard

    from ._wrapper import FullyShardedDataParallel

WRAPPED = "_fsdp_wrapped_module"
"""The wrapper's child holding the wrapped module (torch's attribute, so torch's key segment)."""

FLAT = "_flat_param"
"""The wrapped module's flat parameter (``use_orig_params=False``): torch's name and key."""

HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
"""The strategies that shard within a group and replicate across a second one."""


class UnitBase(nn.Module):
    """The base of ``FullyShardedDataParallel``: what ``is_unit`` recognises."""


def is_unit(module: object) -> TypeGuard[FullyShardedDataParallel]:
    """Whether ``module`` is an FSDP unit (an instance of ``FullyShardedDataParallel``)."""
    return isinstance(module, UnitBase)


def units_under(module: nn.Module, root_only: bool = False) -> list[FullyShardedDataParallel]:
    """Every FSDP unit in ``module``'s tree, in ``modules()`` order (only the outermost ones
    with ``root_only``)."""
    found = [m for m in module.modules() if is_unit(m)]
    if not root_only:
        return found
    inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [m for m in found if id(m) not in inner]


def clean_name(name: str) -> str:
    """``name`` without the wrapper segments (torch's clean FQN)."""
    parts = [part for part in name.split(".") if part and part != WRAPPED]
    return ".".join(parts)
