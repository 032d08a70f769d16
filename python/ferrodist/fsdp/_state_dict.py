"""Model state dicts of an FSDP tree: the type settings, the FULL, LOCAL and SHARDED state dicts.

Why FULL first: a FULL state dict holds plain tensors under the original names, so it is the
format that moves between torch's FSDP and ferrodist's, between world sizes, and into a model
that is not sharded at all. It is built by gathering every unit (``_unshard.summon``), letting
``nn.Module`` walk the tree, then dropping the wrapper segments and the flat parameters from the
keys; loading is the reverse, with the gathered buffers written back into each rank's shard.
LOCAL is torch's too: each unit's unpadded shard as a ``ShardedTensor`` under ``_flat_param``,
for saving and loading at the same world size without any communication. SHARDED is the FULL
dict with each parameter cut into dim-0 chunks (torch's ``ShardedTensor``s, what
``torch.distributed.checkpoint`` writes), so it reshards to any world size on load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.nn.modules.module import _IncompatibleKeys

from . import _unshard

if TYPE_CHECKING:
    from ._flat import FlatHandle
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


def _units(module: nn.Module) -> list[FullyShardedDataParallel]:
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
    for unit in _units(module):
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
    for unit in _units(module):
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
    if settings is None:
        raise ValueError("No FSDP modules found in the module tree")
    return settings


class _Walking:
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
    kind = unit._state_dict_type
    if kind == StateDictType.LOCAL_STATE_DICT:
        return _local_state_dict(unit, *args, **kwargs)
    if kind == StateDictType.SHARDED_STATE_DICT:
        return _sharded_state_dict(unit, *args, **kwargs)
    if kind != StateDictType.FULL_STATE_DICT:
        raise NotImplementedError(f"ferrodist FSDP: {kind} is not implemented yet")
    config = unit._state_dict_config
    rank0_only = bool(getattr(config, "rank0_only", False))
    offload = bool(getattr(config, "offload_to_cpu", False))
    return _full_state_dict(unit, rank0_only, offload, *args, **kwargs)


def _full_state_dict(
    unit: FullyShardedDataParallel, rank0_only: bool, offload: bool, *args: Any, **kwargs: Any
) -> Any:
    """Every unit gathered; plain clones of the parameters under their original names."""
    from ._wrapper import FLAT, clean_name

    units = _units(unit)
    with _unshard.summon(unit, recurse=True, writeback=False), _Walking(units):
        raw = nn.Module.state_dict(unit, *args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        param_keys = {prefix + name for name, _ in nn.Module.named_parameters(unit)}
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
    if kind == StateDictType.LOCAL_STATE_DICT:
        return _load_local_state_dict(unit, state, strict)
    if kind == StateDictType.SHARDED_STATE_DICT:
        state = _gather_sharded(unit, state)
    elif kind != StateDictType.FULL_STATE_DICT:
        raise NotImplementedError(f"ferrodist FSDP: {kind} is not implemented yet")
    units = _units(unit)
    with _unshard.summon(unit, recurse=True, writeback=True), _Walking(units):
        names = [n for n, _ in nn.Module.named_parameters(unit)] + [
            n for n, _ in nn.Module.named_buffers(unit)
        ]
        prefixed = {clean_name(n): n for n in names if not n.endswith(FLAT)}
        translated = {prefixed.get(k, k): v for k, v in state.items()}
        result = nn.Module.load_state_dict(unit, translated, strict=False)
    missing = [clean_name(k) for k in result.missing_keys if not k.endswith(FLAT)]
    unexpected = [clean_name(k) for k in result.unexpected_keys]
    return _check_strict(unit, missing, unexpected, strict)


def _check_strict(
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


# ----- LOCAL: each rank's flat shards as ShardedTensors -----


def _flat_keys(unit: FullyShardedDataParallel, prefix: str) -> dict[str, FlatHandle]:
    """The prefixed ``_flat_param`` key of every sharded unit under ``unit``."""
    from ._wrapper import FLAT, WRAPPED, FullyShardedDataParallel

    keys = {}
    for name, sub in nn.Module.named_modules(unit):
        if isinstance(sub, FullyShardedDataParallel) and sub._handle is not None:
            if not sub._handle.sharded:
                raise RuntimeError(
                    "``local_state_dict`` can only be used when parameters are flatten and sharded."
                )
            if sub._handle.use_orig_params:
                raise NotImplementedError(
                    "ferrodist FSDP: LOCAL_STATE_DICT with use_orig_params=True is not "
                    "implemented yet"
                )
            keys[f"{prefix}{name + '.' if name else ''}{WRAPPED}.{FLAT}"] = sub._handle
    return keys


def _local_state_dict(unit: FullyShardedDataParallel, *args: Any, **kwargs: Any) -> Any:
    """torch's LOCAL state dict: buffers, and each unit's unpadded shard as a ShardedTensor."""
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    from ._wrapper import clean_name

    prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
    flats = _flat_keys(unit, prefix)
    offload = bool(getattr(unit._state_dict_config, "offload_to_cpu", False))
    with _Walking(_units(unit)):
        raw = nn.Module.state_dict(unit, *args, **kwargs)
    out = type(raw)()
    for key, value in raw.items():
        handle = flats.get(key)
        if handle is not None:
            valid = handle.layout.shard_numel - handle.layout.shard_padding(handle.rank)
            offset = handle.layout.shard_numel * handle.rank
            shards = (
                [Shard.from_tensor_and_offsets(value[:valid].view(valid), [offset], handle.rank)]
                if valid > 0
                else []
            )
            value = init_from_local_shards(
                shards, handle.layout.flat_numel, process_group=handle.group
            )
            if offload:
                value = value.cpu()
        out[clean_name(key)] = value
    return out


def _load_local_state_dict(
    unit: FullyShardedDataParallel, state: Any, strict: bool
) -> _IncompatibleKeys:
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from ._wrapper import clean_name

    flats = _flat_keys(unit, "")
    names = [n for n, _ in nn.Module.named_parameters(unit)]
    names += [n for n, _ in nn.Module.named_buffers(unit)]
    prefixed = {clean_name(n): n for n in names}
    translated = {}
    for key, value in state.items():
        full_key = prefixed.get(key, key)
        handle = flats.get(full_key)
        if handle is not None:
            if not isinstance(value, ShardedTensor):
                raise AssertionError("Tensors in local_state_dict should be ShardedTensor.")
            shards = value.local_shards()
            pad = handle.layout.shard_padding(handle.rank)
            if pad < handle.layout.shard_numel:
                tensor = shards[0].tensor
                value = F.pad(tensor, [0, pad]) if pad > 0 else tensor
            else:
                value = handle.flat_param.detach()
        translated[full_key] = value
    with _Walking(_units(unit)):
        result = nn.Module.load_state_dict(unit, translated, strict=False)
    missing = [clean_name(k) for k in result.missing_keys]
    unexpected = [clean_name(k) for k in result.unexpected_keys]
    return _check_strict(unit, missing, unexpected, strict)


# ----- SHARDED: each original parameter chunked along dim 0 across the shard group -----


def _param_handles(unit: FullyShardedDataParallel) -> dict[str, FlatHandle]:
    """Clean name of every flattened original parameter -> its unit's handle."""
    from ._wrapper import FullyShardedDataParallel, clean_name

    out = {}
    for name, sub in nn.Module.named_modules(unit):
        if isinstance(sub, FullyShardedDataParallel) and sub._handle is not None:
            handle = sub._handle
            if not handle.sharded:
                raise RuntimeError(
                    "load_sharded_state_dict can only be called when parameters "
                    "are flattened and sharded."
                )
            prefix = clean_name(name)
            for slot in handle.slots:
                out[clean_name(f"{prefix}.{slot.fqn}" if prefix else slot.fqn)] = handle
    return out


def _sharded_state_dict(unit: FullyShardedDataParallel, *args: Any, **kwargs: Any) -> Any:
    """torch's SHARDED state dict: the FULL one with every parameter cut into dim-0 chunks,
    one ``ShardedTensor`` per parameter (what ``torch.distributed.checkpoint`` saves)."""
    from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

    handles = _param_handles(unit)
    config = unit._state_dict_config
    full = _full_state_dict(unit, False, False, *args, **kwargs)
    prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
    for key, value in list(full.items()):
        handle = handles.get(key[len(prefix) :])
        if handle is None:
            continue
        device = value.device
        per_node = torch.cuda.device_count() if device.type == "cuda" else 1
        chunked = _create_chunk_sharded_tensor(
            value, handle.rank, handle.world_size, per_node, handle.group, device=device
        )
        full[key] = chunked.cpu() if getattr(config, "offload_to_cpu", False) else chunked
    return full


def _gather_sharded(unit: FullyShardedDataParallel, state: Any) -> Any:
    """The FULL state dict a SHARDED one stands for (one all-gather per parameter)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    from ._collectives import all_gather_flat

    handles = _param_handles(unit)
    out = type(state)()
    for key, value in state.items():
        handle = handles.get(key)
        if handle is None or not isinstance(value, ShardedTensor):
            out[key] = value
            continue
        size = value.size()
        numel = size.numel()
        chunk = -(-size[0] // handle.world_size) * numel // size[0]
        shards = value.local_shards()
        if len(shards) > 1:
            raise AssertionError(
                f"Expects 0 or 1 shard per rank but got {len(shards)} shards on rank {handle.rank}."
            )
        if shards:
            local = shards[0].tensor.flatten()
            if chunk > local.numel():
                local = F.pad(local, [0, chunk - local.numel()])
        else:
            local = torch.zeros(chunk, dtype=value.dtype)
        gathered = local.new_empty(chunk * handle.world_size)
        all_gather_flat(gathered, local.contiguous(), group=handle.group)
        out[key] = gathered.narrow(0, 0, numel).reshape(size)
    return out
