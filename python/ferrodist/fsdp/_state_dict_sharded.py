"""LOCAL and SHARDED state dicts: torch's ``ShardedTensor`` formats of an FSDP tree.

Why apart from FULL: both hand torch's sharded-tensor types to the caller. LOCAL is each unit's
unpadded flat shard under ``_flat_param`` (same world size, no communication). With
``use_orig_params=True`` torch also lists each original as its 1-D slice of the shard (what
loading writes back) and reports the ``_flat_param`` keys as unexpected on load; ferrodist does
the same. SHARDED is the FULL dict with every parameter cut into dim-0 chunks, what
``torch.distributed.checkpoint`` writes and reshards to any world size on load (one all-gather
per parameter); DTensors instead of ShardedTensors when FSDP has a device mesh (``_dtensor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, init_from_local_shards
from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor
from torch.nn.modules.module import _IncompatibleKeys

from . import _dtensor, _state_dict_full
from ._collectives import all_gather_flat
from ._shared import FLAT, WRAPPED, clean_name, is_unit, units_under
from ._torch_dtensor import DTensor

if TYPE_CHECKING:
    from ._flat import FlatHandle
    from ._wrapper import FullyShardedDataParallel


# ----- LOCAL: each rank's flat shards as ShardedTensors -----


def _flat_keys(unit: FullyShardedDataParallel, prefix: str) -> dict[str, FlatHandle]:
    """The prefixed ``_flat_param`` key of every sharded unit under ``unit``."""
    keys = {}
    for name, sub in nn.Module.named_modules(unit):
        if is_unit(sub) and sub._handle is not None:
            if not sub._handle.sharded:
                raise RuntimeError(
                    "``local_state_dict`` can only be used when parameters are flatten and sharded."
                )
            keys[f"{prefix}{name + '.' if name else ''}{WRAPPED}.{FLAT}"] = sub._handle
    return keys


def local_state_dict(unit: FullyShardedDataParallel, *args: Any, **kwargs: Any) -> Any:
    """torch's LOCAL state dict: buffers, and each unit's unpadded shard as a ShardedTensor."""
    prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
    flats = _flat_keys(unit, prefix)
    offload = bool(getattr(unit._state_dict_config, "offload_to_cpu", False))
    with _state_dict_full.Walking(units_under(unit)):
        raw = nn.Module.state_dict(unit, *args, **kwargs)

    def flat_shard(handle: FlatHandle) -> Any:
        valid = handle.layout.shard_numel - handle.layout.shard_padding(handle.rank)
        offset = handle.layout.shard_numel * handle.rank
        local = handle.flat_param.detach()
        shards = (
            [Shard.from_tensor_and_offsets(local[:valid].view(valid), [offset], handle.rank)]
            if valid > 0
            else []
        )
        value = init_from_local_shards(shards, handle.layout.flat_numel, process_group=handle.group)
        return value.cpu() if offload else value

    after = _orig_flat_anchors(raw, flats)
    out = type(raw)()
    for key, value in raw.items():
        handle = flats.get(key)
        out[clean_name(key)] = flat_shard(handle) if handle is not None else value
        for flat_key in after.get(key, []):
            out[clean_name(flat_key)] = flat_shard(flats[flat_key])
    return out


def _orig_flat_anchors(raw: Any, flats: dict[str, FlatHandle]) -> dict[str, list[str]]:
    """``use_orig_params=True``: the flat parameter is no registered parameter, so no walk
    yields its key; torch adds it once the unit's whole subtree is written. Returns, for the
    last key of each such unit's subtree, the flat keys to put right after it (inner units
    first)."""
    after: dict[str, list[str]] = {}
    keys = list(raw)
    for flat_key, handle in sorted(flats.items(), key=lambda item: -len(item[0])):
        if not handle.use_orig_params:
            continue
        subtree = flat_key[: -len(f"{WRAPPED}.{FLAT}")]
        mine = [k for k in keys if k.startswith(subtree)]
        if mine:
            after.setdefault(mine[-1], []).append(flat_key)
    return after


def load_local_state_dict(
    unit: FullyShardedDataParallel, state: Any, strict: bool
) -> _IncompatibleKeys:
    """Load torch's LOCAL state dict: each ``_flat_param`` ShardedTensor back into its unit's
    padded shard, the rest as ``nn.Module`` loads it."""
    flats = _flat_keys(unit, "")
    names = [n for n, _ in nn.Module.named_parameters(unit)]
    names += [n for n, _ in nn.Module.named_buffers(unit)]
    prefixed = {clean_name(n): n for n in names}
    # use_orig_params=True: nothing registers the flat key, which nn.Module then reports as
    # unexpected where torch does (at the wrapped module, not at the root).
    prefixed.update({clean_name(k): k for k in flats})
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
    with _state_dict_full.Walking(units_under(unit)):
        result = nn.Module.load_state_dict(unit, translated, strict=False)
    missing = [clean_name(k) for k in result.missing_keys]
    unexpected = [clean_name(k) for k in result.unexpected_keys]
    return _state_dict_full.check_strict(unit, missing, unexpected, strict)


# ----- SHARDED: each original parameter chunked along dim 0 across the shard group -----


def _param_units(unit: FullyShardedDataParallel) -> dict[str, FullyShardedDataParallel]:
    """Clean name of every flattened original parameter -> the unit that flattened it."""
    out = {}
    for name, sub in nn.Module.named_modules(unit):
        if is_unit(sub) and sub._handle is not None:
            handle = sub._handle
            if not handle.sharded:
                raise RuntimeError(
                    "load_sharded_state_dict can only be called when parameters "
                    "are flattened and sharded."
                )
            prefix = clean_name(name)
            for slot in handle.slots:
                out[clean_name(f"{prefix}.{slot.fqn}" if prefix else slot.fqn)] = sub
    return out


def sharded_state_dict(unit: FullyShardedDataParallel, *args: Any, **kwargs: Any) -> Any:
    """torch's SHARDED state dict: the FULL one with every parameter cut into dim-0 chunks,
    one ``ShardedTensor`` (or, with ``_use_dtensor``, one DTensor on the unit's device mesh)
    per parameter: what ``torch.distributed.checkpoint`` saves."""
    owners = _param_units(unit)
    config = unit._state_dict_config
    full = _state_dict_full.full_state_dict(unit, False, False, *args, **kwargs)
    prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
    for key, value in list(full.items()):
        owner = owners.get(key[len(prefix) :])
        if owner is None:
            continue
        handle = owner._handle
        assert handle is not None
        chunked: Any
        if _dtensor.wanted(owner._state_dict_config):
            chunked = _dtensor.chunk(value, owner._device_mesh)
        else:
            device = value.device
            per_node = torch.cuda.device_count() if device.type == "cuda" else 1
            chunked = _create_chunk_sharded_tensor(
                value, handle.rank, handle.world_size, per_node, handle.group, device=device
            )
        full[key] = chunked.cpu() if getattr(config, "offload_to_cpu", False) else chunked
    return full


def gather_sharded(unit: FullyShardedDataParallel, state: Any) -> Any:
    """The FULL state dict a SHARDED one stands for (one all-gather per parameter), from
    ShardedTensors or DTensors alike."""
    owners = _param_units(unit)
    out = type(state)()
    for key, value in state.items():
        owner = owners.get(key)
        if owner is not None and isinstance(value, DTensor):
            out[key] = _dtensor.gather(value)
            continue
        if owner is None or not isinstance(value, ShardedTensor):
            out[key] = value
            continue
        handle = owner._handle
        assert handle is not None
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
