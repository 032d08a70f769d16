"""Model state dicts of an FSDP tree: the type settings, and the call that picks the format.

Why apart from the formats: ``set_state_dict_type`` and friends are torch's checks on settings
every unit shares, and ``state_dict`` / ``load_state_dict`` only choose, per torch's rules
(NO_SHARD always gives FULL; a device mesh turns SHARDED into DTensors), between FULL
(``_state_dict_full``: plain tensors under the original names, the format that moves between
torch's FSDP and ferrodist's and between world sizes) and LOCAL or SHARDED
(``_state_dict_sharded``: torch's ``ShardedTensor`` forms, LOCAL for the same world size without
communication, SHARDED chunked along dim 0 for ``torch.distributed.checkpoint``).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Optional

from torch import nn
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.nn.modules.module import _IncompatibleKeys

from . import _dtensor, _state_dict_full, _state_dict_sharded
from ._shared import units_under

if TYPE_CHECKING:
    from ._wrapper import FullyShardedDataParallel

_CONFIG: dict[StateDictType, type[StateDictConfig]] = {
    StateDictType.FULL_STATE_DICT: FullStateDictConfig,
    StateDictType.LOCAL_STATE_DICT: LocalStateDictConfig,
    StateDictType.SHARDED_STATE_DICT: ShardedStateDictConfig,
}
_OPTIM_CONFIG: dict[StateDictType, type[OptimStateDictConfig]] = {
    StateDictType.FULL_STATE_DICT: FullOptimStateDictConfig,
    StateDictType.LOCAL_STATE_DICT: LocalOptimStateDictConfig,
    StateDictType.SHARDED_STATE_DICT: ShardedOptimStateDictConfig,
}


def default_config(kind: StateDictType) -> StateDictConfig:
    """torch's default config object for ``kind``."""
    return _CONFIG[kind]()


def default_optim_config(kind: StateDictType) -> OptimStateDictConfig:
    """torch's default optimizer config object for ``kind``."""
    return _OPTIM_CONFIG[kind]()


def set_type(
    module: nn.Module,
    kind: StateDictType,
    config: Optional[StateDictConfig],
    optim_config: Optional[OptimStateDictConfig],
) -> StateDictSettings:
    """torch's ``set_state_dict_type``: same checks, same errors, previous settings back."""
    config_type = _CONFIG[kind]
    optim_config_type = _OPTIM_CONFIG[kind]
    if config is None:
        config = config_type()
    if optim_config is None:
        optim_config = optim_config_type()
    if config_type is not type(config):
        raise RuntimeError(
            f"Expected state_dict_config of type {config_type} but got {type(config)}"
        )
    if optim_config_type is not type(optim_config):
        raise RuntimeError(
            f"Expected optim_state_dict_config of type {optim_config_type} "
            f"but got {type(optim_config)}"
        )
    previous: Optional[StateDictSettings] = None
    for unit in units_under(module):
        if previous is None:
            previous = StateDictSettings(
                unit._state_dict_type, unit._state_dict_config, unit._optim_state_dict_config
            )
        elif previous.state_dict_type != unit._state_dict_type:
            raise AssertionError("All FSDP modules should have the same state_dict_type.")
        unit._state_dict_type = kind
        unit._state_dict_config = config
        unit._optim_state_dict_config = optim_config
    if previous is None:
        raise ValueError("No FSDP modules found in the module tree")
    return previous


def get_type(module: nn.Module) -> StateDictSettings:
    """torch's ``get_state_dict_type``: the settings all units share."""
    settings: Optional[StateDictSettings] = None
    for unit in units_under(module):
        mine = StateDictSettings(
            unit._state_dict_type, unit._state_dict_config, unit._optim_state_dict_config
        )
        if settings is None:
            settings = mine
        elif settings != mine:
            raise AssertionError(
                "All FSDP modules must have the same state dict settings."
                f"Got {mine} and {settings}."
            )
        _dtensor.mark_optim_config(unit)
    if settings is None:
        raise ValueError("No FSDP modules found in the module tree")
    return settings


def state_dict(unit: FullyShardedDataParallel, *args: Any, **kwargs: Any) -> Any:
    """The state dict of ``unit``'s type (FULL: plain, cloned tensors under original names)."""
    if getattr(unit, "_walking_state_dict", False):
        return nn.Module.state_dict(unit, *args, **kwargs)
    if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
        # torch's rule: an unsharded unit gives a FULL state dict with FULL's default config,
        # whatever type was asked for.
        warnings.warn(
            "When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will be returned.",
            stacklevel=3,
        )
        return _state_dict_full.full_state_dict(unit, False, False, *args, **kwargs)
    _dtensor.mark_model_config(units_under(unit))
    kind = unit._state_dict_type
    if kind == StateDictType.LOCAL_STATE_DICT:
        return _state_dict_sharded.local_state_dict(unit, *args, **kwargs)
    if kind == StateDictType.SHARDED_STATE_DICT:
        return _state_dict_sharded.sharded_state_dict(unit, *args, **kwargs)
    if kind != StateDictType.FULL_STATE_DICT:
        raise NotImplementedError(f"ferrodist FSDP: {kind} is not implemented yet")
    config = unit._state_dict_config
    rank0_only = bool(getattr(config, "rank0_only", False))
    offload = bool(getattr(config, "offload_to_cpu", False))
    return _state_dict_full.full_state_dict(unit, rank0_only, offload, *args, **kwargs)


def load_state_dict(
    unit: FullyShardedDataParallel, state: Any, strict: bool = True
) -> _IncompatibleKeys:
    """Load a state dict of ``unit``'s type; returns torch's ``_IncompatibleKeys``."""
    kind = unit._state_dict_type
    if unit.sharding_strategy == ShardingStrategy.NO_SHARD:
        warnings.warn(  # torch's text, its missing space included
            "When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict willbe returned.",
            stacklevel=3,
        )
        kind = StateDictType.FULL_STATE_DICT
    else:
        _dtensor.mark_model_config(units_under(unit))
    if kind == StateDictType.LOCAL_STATE_DICT:
        return _state_dict_sharded.load_local_state_dict(unit, state, strict)
    if kind == StateDictType.SHARDED_STATE_DICT:
        state = _state_dict_sharded.gather_sharded(unit, state)
    elif kind != StateDictType.FULL_STATE_DICT:
        raise NotImplementedError(f"ferrodist FSDP: {kind} is not implemented yet")
    return _state_dict_full.load_full_state_dict(unit, state, strict)
