"""SHARDED and LOCAL optimizer state dicts: the FULL one with every per-element state chunked.

Why this shape: torch's FSDP gives the same optimizer state dict for both non-FULL model types.
It is keyed by original parameter names like the FULL one, and every positive-dimension state of
a parameter FSDP manages (``exp_avg``, ``momentum_buffer``...) is a ``ShardedTensor`` cut into
dim-0 chunks over that parameter's unit group. Scalars (``step``), the states of parameters
FSDP does not manage, and (torch's exception) those of ``use_orig_params`` units that are not
sharded stay plain. With a device mesh those chunks are DTensors instead (``_dtensor``).
``torch.distributed.checkpoint`` saves such a dict and reshards
it to any world size on load, so a checkpoint moves between world sizes and between torch's FSDP
and ferrodist's. Loading gathers every ``ShardedTensor`` back into a whole tensor and cuts the
result as the FULL path does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.fsdp._shard_utils import _create_chunk_sharded_tensor

from . import _dtensor, _optim_state
from ._collectives import all_gather_flat
from ._shared import is_unit
from ._torch_dtensor import DTensor

if TYPE_CHECKING:
    from ._flat import FlatHandle
    from ._wrapper import FullyShardedDataParallel


def _managed_handles(model: nn.Module) -> dict[str, FlatHandle]:
    """Clean name of every parameter an FSDP unit manages -> that unit's handle."""
    _, handles = _optim_state._owners(model)
    return {fqn: handle for handle, fqns in handles for fqn in fqns}


def _units_by_handle(model: nn.Module) -> dict[int, FullyShardedDataParallel]:
    return {
        id(unit._handle): unit
        for unit in model.modules()
        if is_unit(unit) and unit._handle is not None
    }


def _chunk(value: torch.Tensor, unit: FullyShardedDataParallel) -> ShardedTensor | DTensor:
    """``value`` cut into dim-0 chunks over the unit's group; this rank keeps its own chunk.
    A DTensor on the unit's device mesh where its optimizer config asks for one (torch reads
    each unit's own config)."""
    if _dtensor.wanted(unit._optim_state_dict_config):
        return _dtensor.chunk(value, unit._device_mesh)
    handle = unit._handle
    assert handle is not None
    per_node = torch.cuda.device_count() if value.device.type == "cuda" else 1
    return _create_chunk_sharded_tensor(
        value, handle.rank, handle.world_size, per_node, handle.group
    )


def sharded_optim_state_dict(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    optim_state: Optional[dict[str, Any]],
    offload_to_cpu: bool,
) -> dict[str, Any]:
    """torch's SHARDED/LOCAL optimizer state dict: name-keyed, per-element states chunked."""
    out = _optim_state.full_optim_state_dict(
        model, optim, optim_state, rank0_only=False, offload_to_cpu=False
    )
    handles = _managed_handles(model)
    units = _units_by_handle(model)
    for fqn, entry in out["state"].items():
        handle = handles.get(fqn)
        if not isinstance(entry, dict):
            continue
        for key, value in list(entry.items()):
            if not isinstance(value, torch.Tensor):
                continue
            if handle is not None and value.dim() > 0 and not _optim_state._kept_as_is(handle):
                value = _chunk(value, units[id(handle)])
            entry[key] = value.cpu() if offload_to_cpu else value
    return out


def gather(value: ShardedTensor) -> torch.Tensor:
    """The whole tensor of a ``ShardedTensor`` chunked along dim 0 (one shard per rank at
    most), on every rank of its group: one all-gather of equal-sized padded pieces."""
    group = value._process_group
    metadata = value.metadata()
    size = metadata.size
    row = size[1:].numel() if len(size) > 1 else 1
    pieces = []
    for shard in metadata.shards_metadata:
        if any(offset != 0 for offset in shard.shard_offsets[1:]) or list(
            shard.shard_sizes[1:]
        ) != list(size[1:]):
            raise ValueError("only ShardedTensors chunked along dim 0 can be gathered")
        global_rank = shard.placement.rank() if shard.placement is not None else None
        assert global_rank is not None, "a shard without a rank"
        pieces.append((dist.get_group_rank(group, global_rank), shard))
    chunk = max((s.shard_sizes[0] * row for _, s in pieces), default=0)
    local = value.local_shards()
    if len(local) > 1:
        raise AssertionError(f"Expects 0 or 1 shard per rank but got {len(local)} shards.")
    dtype = metadata.tensor_properties.dtype
    if local:
        mine = local[0].tensor.detach().reshape(-1).to(dtype)
        device = mine.device
        if mine.numel() < chunk:
            mine = F.pad(mine, [0, chunk - mine.numel()])
    else:
        # No chunk here (more ranks than rows): contribute zeros on the chunks' device type.
        placed = pieces[0][1].placement if pieces else None
        device = placed.device() if placed is not None else torch.device("cpu")
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        mine = torch.zeros(chunk, dtype=dtype, device=device)
    world = dist.get_world_size(group)
    gathered = mine.new_empty(chunk * world)
    all_gather_flat(gathered, mine.contiguous(), group=group)
    full = torch.empty(size.numel(), dtype=dtype, device=device)
    for group_rank, shard in pieces:
        numel = shard.shard_sizes[0] * row
        start = shard.shard_offsets[0] * row
        full[start : start + numel] = gathered[group_rank * chunk : group_rank * chunk + numel]
    return full.view(size)


def gathered(model: nn.Module, osd: dict[str, Any]) -> dict[str, Any]:
    """``osd`` with every ``ShardedTensor`` or DTensor state replaced by its whole tensor.

    The all-gathers run in the model's parameter order, state names sorted, then any other
    entries in the dict's order, so every rank issues them alike.
    """
    state = osd.get("state", {})
    order = [fqn for fqn in _managed_handles(model) if fqn in state]
    managed = set(order)
    order += [key for key in state if key not in managed]
    out_state: dict[Any, Any] = dict(state)
    for fqn in order:
        entry = state[fqn]
        if not isinstance(entry, dict):
            continue
        if not any(isinstance(v, (ShardedTensor, DTensor)) for v in entry.values()):
            continue
        new_entry = dict(entry)
        for key in sorted(entry, key=str):
            value = entry[key]
            if isinstance(value, ShardedTensor):
                new_entry[key] = gather(value)
            elif isinstance(value, DTensor):
                new_entry[key] = _dtensor.gather(value)
        out_state[fqn] = new_entry
    return {**osd, "state": out_state}
