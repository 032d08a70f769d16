"""Optimizer state dicts of an FSDP model: FULL (keyed by original names) and back.

Why: the optimizer steps flat shards (``use_orig_params=False``) or 1-D slices of the originals
(``use_orig_params=True``), so its own ``state_dict()`` only makes sense for one world size and
one wrapping. torch's FULL optimizer state dict is keyed by the original parameter names, holds
whole tensors in the original shapes, and loads into any wrapping at any world size; ferrodist
produces and consumes exactly that format, so optimizer checkpoints move between torch's FSDP
and ferrodist's as model checkpoints do.

Both directions go one unit at a time: each rank lays its part of every per-element state
(``exp_avg``...) out as the unit's local shard, one all-gather makes the whole flat tensor, and
the unit's views cut it into the original shapes. Per-parameter scalars (``step``) are copied;
with ``use_orig_params`` a parameter can live on other ranks only, so those travel once per call
with ``all_gather_object``.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import OptimStateKeyType

from ._collectives import all_gather_flat
from ._shared import clean_name, is_unit

if TYPE_CHECKING:
    from ._flat import FlatHandle


class _Owner:
    """What one optimizer parameter is: a unit's flat shard, one original's slice, or a
    parameter FSDP does not manage."""

    def __init__(self, handle: Optional[FlatHandle], index: Optional[int], fqns: list[str]) -> None:
        self.handle = handle
        self.index = index  # original's index in the handle, or None for the flat param
        self.fqns = fqns


def _owners(model: nn.Module) -> tuple[dict[int, _Owner], list[tuple[FlatHandle, list[str]]]]:
    """Every parameter the model exposes, by id, and every unit's handle with its names."""
    owners: dict[int, _Owner] = {}
    handles: list[tuple[FlatHandle, list[str]]] = []
    for name, unit in model.named_modules():
        if not is_unit(unit) or unit._handle is None:
            continue
        handle = unit._handle
        prefix = clean_name(name)
        fqns = [clean_name(f"{prefix}.{s.fqn}" if prefix else s.fqn) for s in handle.slots]
        handles.append((handle, fqns))
        if handle.use_orig_params:
            for index, param in enumerate(handle.orig_params):
                owners[id(param)] = _Owner(handle, index, [fqns[index]])
        else:
            owners[id(handle.flat_param)] = _Owner(handle, None, fqns)
    for name, param in nn.Module.named_parameters(model):
        if id(param) not in owners:
            owners[id(param)] = _Owner(None, None, [clean_name(name)])
    return owners, handles


def _is_per_element(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """Scalars as they are, per-element tensors only by name (they are gathered apart)."""
    return {k: ("elements" if _is_per_element(v) else v) for k, v in entry.items()}


def full_optim_state_dict(
    model: nn.Module,
    optim: torch.optim.Optimizer,
    optim_state: Optional[dict[str, Any]] = None,
    rank0_only: bool = False,
    offload_to_cpu: bool = False,
) -> dict[str, Any]:
    """torch's FULL optimizer state dict: whole tensors keyed by original names."""
    owners, handles = _owners(model)
    osd = optim.state_dict() if optim_state is None else optim_state
    params = [p for group in optim.param_groups for p in group["params"]]
    by_id = {id(p): i for i, p in enumerate(params)}
    local_state: dict[int, dict[str, Any]] = osd["state"]
    # Scalars and the keys of each original, as this rank sees them, for everyone.
    summary: dict[str, dict[str, Any]] = {}
    for param in params:
        owner = owners[id(param)]
        entry = local_state.get(by_id[id(param)])
        if entry is None or owner.handle is None:
            continue
        if owner.index is None:
            for fqn in owner.fqns:
                summary[fqn] = {
                    k: ("elements" if _is_per_element(v) else v) for k, v in entry.items()
                }
        elif owner.handle.shard_infos[owner.index].in_shard:
            summary[owner.fqns[0]] = {
                k: ("elements" if _is_per_element(v) else v) for k, v in entry.items()
            }
    everyone: list[Optional[dict[str, dict[str, Any]]]] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, summary)
    merged: dict[str, dict[str, Any]] = {}
    for part in everyone:
        for fqn, keys in (part or {}).items():
            merged.setdefault(fqn, {}).update(keys)
    out_state: dict[str, dict[str, Any]] = {}
    for handle, fqns in handles:
        _gather_unit(handle, fqns, merged, local_state, by_id, out_state, offload_to_cpu)
    for param in params:
        owner = owners[id(param)]
        entry = local_state.get(by_id[id(param)])
        if owner.handle is None and entry is not None:
            out_state[owner.fqns[0]] = copy.copy(entry)
    groups = []
    for group_state, group in zip(osd["param_groups"], optim.param_groups):
        names: list[str] = []
        for param in group["params"]:
            names.extend(owners[id(param)].fqns)
        groups.append({**{k: v for k, v in group_state.items() if k != "params"}, "params": names})
    if rank0_only and dist.get_rank() != 0:
        return {}
    orig_params = {
        fqn: h.use_orig_params for h, fqns in handles for fqn in fqns if not _kept_as_is(h)
    }
    names = [fqn for group in groups for fqn in group["params"] if fqn in out_state]
    if any(h.use_orig_params for h, _ in handles):
        names = _orig_params_order(names, handles)
    ordered = {fqn: _torch_key_order(out_state[fqn], orig_params.get(fqn)) for fqn in names}
    return {"state": ordered, "param_groups": groups}


def _orig_params_order(names: list[str], handles: list[tuple[FlatHandle, list[str]]]) -> list[str]:
    """torch's entry order with ``use_orig_params``: it merges every rank's names and sorts
    them, writes the unmanaged entries first, then each unit's entries together, units in the
    order of their first sorted name."""
    unit_of = {fqn: index for index, (_, fqns) in enumerate(handles) for fqn in fqns}
    present = sorted(names)
    out = [fqn for fqn in present if fqn not in unit_of]
    units: dict[int, list[str]] = {}
    for fqn in present:
        if fqn in unit_of:
            units.setdefault(unit_of[fqn], []).append(fqn)
    for fqns in units.values():
        out.extend(fqns)
    return out


def _kept_as_is(handle: FlatHandle) -> bool:
    """torch hands the optimizer's own entries back for ``use_orig_params`` units that are not
    sharded (``NO_SHARD`` or a group of one): no gathering, no chunking, no reordering."""
    return handle.use_orig_params and (not handle.sharded or handle.world_size == 1)


def _torch_key_order(entry: dict[str, Any], orig_params: Optional[bool]) -> dict[str, Any]:
    """An FSDP-managed entry's state names in the order torch's FSDP writes them, each kind
    sorted: per-element tensors, 0-dim tensors, the rest (flat parameters); with
    ``use_orig_params`` the rest first and per-element tensors last. Unmanaged entries
    (``orig_params`` None) keep the optimizer's order, as torch copies them."""
    if orig_params is None:
        return entry

    def kind(value: Any) -> int:
        if _is_per_element(value):
            return 2 if orig_params else 0
        if isinstance(value, torch.Tensor):
            return 1
        return 0 if orig_params else 2

    return {k: entry[k] for k in sorted(entry, key=lambda k: (kind(entry[k]), k))}


def _gather_unit(
    handle: FlatHandle,
    fqns: list[str],
    merged: dict[str, dict[str, Any]],
    local_state: dict[int, dict[str, Any]],
    by_id: dict[int, int],
    out_state: dict[str, dict[str, Any]],
    offload_to_cpu: bool,
) -> None:
    """Gather one unit's per-element states and cut them into the originals' shapes."""
    keys: list[str] = []
    for fqn in fqns:
        for key, value in merged.get(fqn, {}).items():
            if value == "elements" and key not in keys:
                keys.append(key)
    for fqn in fqns:
        if fqn in merged:
            out_state[fqn] = {k: v for k, v in merged[fqn].items() if v != "elements"}
    dtype = handle.local_shard.dtype
    for key in sorted(keys):
        local = _local_flat_state(handle, key, local_state, by_id, dtype)
        if handle.sharded:
            full = local.new_empty(handle.layout.padded_unsharded_numel)
            all_gather_flat(full, local, group=handle.group)
        else:
            full = local
        views = handle.unflat_views(full[: handle.layout.flat_numel])
        for fqn, view in zip(fqns, views):
            if fqn in out_state:
                tensor = view.clone()
                out_state[fqn][key] = tensor.cpu() if offload_to_cpu else tensor


def _local_flat_state(
    handle: FlatHandle,
    key: str,
    local_state: dict[int, dict[str, Any]],
    by_id: dict[int, int],
    dtype: torch.dtype,
) -> torch.Tensor:
    """This rank's state ``key`` laid out like the unit's local shard (zeros where none)."""
    if not handle.use_orig_params:
        entry = local_state.get(by_id.get(id(handle.flat_param), -1), {})
        value = entry.get(key)
        if isinstance(value, torch.Tensor):
            return value.detach().contiguous()
        return torch.zeros_like(handle.local_shard)
    local = torch.zeros(handle.local_shard.numel(), dtype=dtype)
    for param, info in zip(handle.orig_params, handle.shard_infos):
        entry = local_state.get(by_id.get(id(param), -1), {})
        value = entry.get(key)
        if info.in_shard and isinstance(value, torch.Tensor):
            assert info.offset_in_shard is not None and info.numel_in_shard is not None
            local[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard] = (
                value.reshape(-1)
            )
    return local


class _GroupsLike:
    """The parameter groups a FULL state dict names, over ``model``'s parameters: what
    ``shard_full_optim_state_dict`` uses when given no optimizer."""

    def __init__(self, model: nn.Module, full: dict[str, Any]) -> None:
        owners, _ = _owners(model)
        by_name: dict[str, nn.Parameter] = {}
        for param in model.parameters():
            for fqn in owners[id(param)].fqns:
                by_name[fqn] = param
        self.param_groups = []
        for group in full["param_groups"]:
            params: list[nn.Parameter] = []
            for fqn in group["params"]:
                param = by_name[fqn]
                if not any(param is q for q in params):
                    params.append(param)
            self.param_groups.append({"params": params})


def optim_state_dict_to_load(model: nn.Module, optim: Any, full: dict[str, Any]) -> dict[str, Any]:
    """This rank's ``optim.load_state_dict`` input from a FULL (name-keyed) state dict."""
    if optim is None:
        optim = _GroupsLike(model, full)
    owners, _ = _owners(model)
    params = [p for group in optim.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for index, param in enumerate(params):
        owner = owners[id(param)]
        entries = [full["state"].get(fqn) for fqn in owner.fqns]
        if all(e is None for e in entries):
            continue
        if owner.handle is None:
            state[index] = copy.copy(entries[0])
            continue
        handle = owner.handle
        if owner.index is not None:
            sliced = _slice_for_original(handle, owner.index, entries[0])
            if sliced is not None:
                state[index] = sliced
            continue
        state[index] = _flat_shard_entry(handle, owner.fqns, entries)
    groups = []
    position = 0
    for group_state, group in zip(full["param_groups"], optim.param_groups):
        count = len(group["params"])
        groups.append(
            {
                **{k: v for k, v in group_state.items() if k != "params"},
                "params": list(range(position, position + count)),
            }
        )
        position += count
    return {"state": state, "param_groups": groups}


def _slice_for_original(
    handle: FlatHandle, index: int, entry: Optional[dict[str, Any]]
) -> Optional[dict[str, Any]]:
    info = handle.shard_infos[index]
    if entry is None or not info.in_shard:
        return None
    assert info.intra_param_start_idx is not None and info.intra_param_end_idx is not None
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if _is_per_element(value) and not handle.sharded:
            out[key] = value.clone()  # NO_SHARD: the original keeps its shape
        elif _is_per_element(value):
            flat = value.reshape(-1)
            out[key] = flat[info.intra_param_start_idx : info.intra_param_end_idx + 1].clone()
        else:
            out[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def _flat_shard_entry(
    handle: FlatHandle, fqns: list[str], entries: list[Optional[dict[str, Any]]]
) -> dict[str, Any]:
    present = [e for e in entries if e is not None]
    out: dict[str, Any] = {}
    for key, value in present[0].items():
        if _is_per_element(value):
            pieces = []
            for e, slot in zip(entries, handle.slots):
                if e is None:
                    pieces.append(torch.zeros(slot.shape, dtype=value.dtype))
                else:
                    pieces.append(e[key])
            flat = handle.flatten_full(pieces)
            out[key] = handle.shard_of(flat).clone()
        else:
            out[key] = value.clone() if isinstance(value, torch.Tensor) else value
    return out


def broadcast_full(full: Optional[dict[str, Any]], model: nn.Module) -> dict[str, Any]:
    """rank 0's FULL optimizer state dict on every rank (``scatter_full_optim_state_dict``)."""
    holder = [full if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    result = holder[0]
    if result is None:
        raise ValueError("scatter_full_optim_state_dict: rank 0 passed no optimizer state dict")
    return result


def rekey(
    osd: dict[str, Any], key_type: Any, model: nn.Module, optim: Optional[torch.optim.Optimizer]
) -> dict[str, Any]:
    """torch's ``rekey_optim_state_dict``: name keys <-> id keys for a FULL state dict."""
    owners, _ = _owners(model)
    if optim is not None:
        params = [p for group in optim.param_groups for p in group["params"]]
    else:
        params = list(model.parameters())
    names: list[str] = []
    for param in params:
        names.extend(owners[id(param)].fqns)
    if key_type == OptimStateKeyType.PARAM_ID:
        to_id = {name: i for i, name in enumerate(names)}
        return {
            "state": {to_id[k]: v for k, v in osd["state"].items()},
            "param_groups": [
                {**g, "params": [to_id[n] for n in g["params"]]} for g in osd["param_groups"]
            ],
        }
    return {
        "state": {names[k]: v for k, v in osd["state"].items()},
        "param_groups": [
            {**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]
        ],
    }
