"""SHARDED state as ``DTensor``: torch's form once FSDP was built with a ``device_mesh``.

Why a module of its own: the SHARDED model and optimizer state dicts share the rule for when
DTensors replace ShardedTensors and the way to cut and to gather one. torch's rule: a unit that
has a device mesh turns ``_use_dtensor`` on in the config it is asked with (the model's config
when its state dict is taken or loaded, the optimizer's when the settings are read), and refuses
LOCAL state dicts; a user may also set ``_use_dtensor`` by hand (it needs the mesh all the
same: without one, chunking fails as torch's does). Each parameter or per-element
optimizer state is then cut along dim 0 like ``torch.chunk`` over the mesh's last dimension
(the shard group) and replicated over any dimension before it (HYBRID_SHARD's replicate group):
placements ``[Shard(0)]`` on a 1-D mesh, ``[Replicate(), Shard(0)]`` on a 2-D one. Chunks are
``ceil(rows / shards)`` rows, the last ones shorter or empty; the DTensor keeps the whole shape,
so nothing is padded. ``torch.distributed.checkpoint`` saves and reshards such dicts as it does
ShardedTensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import ShardingStrategy, StateDictType

from ._collectives import all_gather_flat
from ._torch_dtensor import DTensor, Replicate, Shard

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ._wrapper import FullyShardedDataParallel

_LOCAL_WITH_MESH = (
    "Found state_dict_type LOCAL_STATE_DICT. "
    "DeviceMesh is not compatible with LOCAL_STATE_DICT. "
    "Please set state_dict_type to SHARDED_STATE_DICT to get DTensor state_dict."
)


def mark_model_config(units: list[FullyShardedDataParallel]) -> None:
    """torch's step before a model state dict is taken or loaded: every sharded unit with a
    device mesh turns ``_use_dtensor`` on in its config (LOCAL: RuntimeError)."""
    for unit in units:
        if unit._device_mesh is None or unit.sharding_strategy == ShardingStrategy.NO_SHARD:
            continue
        if unit._state_dict_type == StateDictType.LOCAL_STATE_DICT:
            raise RuntimeError(_LOCAL_WITH_MESH)
        unit._state_dict_config._use_dtensor = True  # type: ignore[attr-defined]


def mark_optim_config(unit: FullyShardedDataParallel) -> None:
    """torch's step whenever the settings are read: a unit with a device mesh turns
    ``_use_dtensor`` on in its optimizer config (LOCAL: RuntimeError)."""
    if unit._device_mesh is None:
        return
    if unit._state_dict_type == StateDictType.LOCAL_STATE_DICT:
        raise RuntimeError(_LOCAL_WITH_MESH)
    unit._optim_state_dict_config._use_dtensor = True  # type: ignore[attr-defined]


def wanted(config: Any) -> bool:
    """Whether ``config`` asks for DTensors (torch reads the attribute off any config)."""
    return bool(getattr(config, "_use_dtensor", False))


def chunk(value: torch.Tensor, mesh: DeviceMesh | None) -> DTensor:
    """``value`` as a DTensor on ``mesh``: this rank keeps a copy of its dim-0 chunk."""
    if mesh is None:
        raise AssertionError("Expected _device_mesh to be not None, got None")
    value = value.detach()
    coordinate = mesh.get_coordinate()
    assert coordinate is not None, "this rank is not in the device mesh"
    shards = mesh.size(mesh.ndim - 1)
    pieces = torch.chunk(value, shards, dim=0)
    index = coordinate[-1]
    if index < len(pieces):
        local = pieces[index].clone()
    else:  # more shards than rows: an empty chunk of the right trailing shape
        local = value.new_empty((0, *value.shape[1:]))
    placements = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
    return DTensor.from_local(
        local, mesh, placements, run_check=False, shape=value.shape, stride=value.stride()
    )


def is_fsdp_layout(value: DTensor) -> bool:
    """Whether ``value`` is laid out as FSDP cuts: replicated, then dim 0 over the last mesh
    dimension."""
    *outer, last = value.placements
    return all(isinstance(p, Replicate) for p in outer) and last == Shard(0)


def gather(value: DTensor) -> torch.Tensor:
    """The whole tensor of a DTensor, on every rank of its mesh. FSDP's layout takes one
    all-gather of equal, end-padded chunks over the shard group; any other layout is
    redistributed by DTensor itself."""
    if not is_fsdp_layout(value):
        return value.full_tensor()
    mesh = value.device_mesh
    group = mesh.get_group(mesh.ndim - 1)
    shards = mesh.size(mesh.ndim - 1)
    shape = value.shape
    local = value.to_local().detach()
    if local.device.type != mesh.device_type:  # offloaded: back to the mesh's devices
        local = local.to(mesh.device_type)
    if len(shape) == 0 or shape[0] == 0:
        return local.clone().reshape(shape)
    row = shape.numel() // shape[0]
    size = -(-shape[0] // shards) * row
    mine = local.reshape(-1)
    if mine.numel() < size:
        mine = F.pad(mine, [0, size - mine.numel()])
    gathered = mine.new_empty(size * shards)
    all_gather_flat(gathered, mine.contiguous(), group=group)
    return gathered.narrow(0, 0, shape.numel()).reshape(shape)
