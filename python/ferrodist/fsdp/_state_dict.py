"""Model state dicts of an FSDP tree: the type settings, the FULL, LOCAL and SHARDED state dicts.

Why FULL first: a FULL state dict holds plain tensors under the original names, so it is the
format that moves between torch's FSDP and ferrodist's, between world sizes, and into a model
that is not sharded at all. It is built by gathering every unit (``_unshard.summon``), letting
``nn.Module`` walk the tree, then dropping the wrapper segments and the flat parameters from the
keys; loading is the reverse, with the gathered buffers written back into each rank's shard.
LOCAL is torch's too: each unit's unpadded shard as a ``ShardedTensor`` under ``_flat_param``,
for saving and loading at the same world size without any communication. SHARDED is the FULL
dict with each parameter cut into dim-0 chunks (torch's ``ShardedTensor``s, or DTensors when FSDP
has a device mesh; what ``torch.distributed.checkpoint`` writes), so it reshards to any world
size on load.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
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

from . import _dtensor, _state_dict_sharded, _unshard

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


def units_under(module: nn.Module) -> list[FullyShardedDataParallel]:
    from ._wrapper import FullyShardedDataParallel

    return FullyShardedDataParallel.fsdp_modules(module)


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


class Walking:
    """Marks the units under a state-dict call, so nested ``state_dict`` calls go straight
    to ``nn.Module``'s walk instead of gathering again."""

    def __init__(self, units: list[FullyShardedDataParallel]) -> None:
        self.units = units

    def __enter__(self) -> None:
        for unit in self.units:
            unit._walking_state_dict = True

    def __exit__(self, *exc: object) -> None:
        for unit in self.units:
            unit._walking_state_dict = False


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
        return full_state_dict(unit, False, False, *args, **kwargs)
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
    return full_state_dict(unit, rank0_only, offload, *args, **kwargs)


def full_state_dict(
    unit: FullyShardedDataParallel, rank0_only: bool, offload: bool, *args: Any, **kwargs: Any
) -> Any:
    """Every unit gathered; plain clones of the parameters under their original names."""
    from ._wrapper import FLAT, clean_name

    units = units_under(unit)
    with _unshard.summon(unit, recurse=True, writeback=False), Walking(units):
        raw = nn.Module.state_dict(unit, *args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        param_keys = {
            prefix + name for name, _ in nn.Module.named_parameters(unit, remove_duplicate=False)
        }
        # Buffers mixed precision cast come back in their original dtype, as torch's do.
        buffer_dtypes = {
            prefix + name: buffer._fsdp_orig_dtype
            for name, buffer in nn.Module.named_buffers(unit)
            if hasattr(buffer, "_fsdp_orig_dtype")
        }
        out = type(raw)()
        for key, value in raw.items():
            if key == FLAT or key.endswith("." + FLAT):
                continue
            if not isinstance(value, torch.Tensor):
                out[clean_name(key)] = value
                continue
            tensor = value.detach().clone() if key in param_keys else value
            if key in buffer_dtypes:
                tensor = tensor.to(buffer_dtypes[key]).clone()
            if offload:
                tensor = tensor.cpu()
            out[clean_name(key)] = tensor
    if rank0_only and dist.get_rank() != 0:
        return type(raw)()
    return out


def load_state_dict(
    unit: FullyShardedDataParallel, state: Any, strict: bool = True
) -> _IncompatibleKeys:
    """Load a state dict of ``unit``'s type; returns torch's ``_IncompatibleKeys``."""
    from ._wrapper import FLAT, clean_name

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
    units = units_under(unit)
    with _unshard.summon(unit, recurse=True, writeback=True), Walking(units):
        names = [n for n, _ in nn.Module.named_parameters(unit, remove_duplicate=False)] + [
            n for n, _ in nn.Module.named_buffers(unit)
        ]
        prefixed = {clean_name(n): n for n in names if not n.endswith(FLAT)}
        translated = {prefixed.get(k, k): v for k, v in state.items()}
        result = nn.Module.load_state_dict(unit, translated, strict=False)
    missing = [clean_name(k) for k in result.missing_keys if not k.endswith(FLAT)]
    unexpected = [clean_name(k) for k in result.unexpected_keys]
    return check_strict(unit, missing, unexpected, strict)


def check_strict(
    unit: FullyShardedDataParallel, missing: list[str], unexpected: list[str], strict: bool
) -> _IncompatibleKeys:
    """nn.Module's strict-loading error, with clean names."""
    if strict and (missing or unexpected):
        lines = []
        if unexpected:
            lines.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". "
            )
        if missing:
            lines.append(
                "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". "
            )
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(unit).__name__}:\n\t" + "\n\t".join(lines)
        )
    return _IncompatibleKeys(missing, unexpected)
