"""Checkpoint logic of ``ZeroRedundancyOptimizer``: consolidating shards, loading with resharding.

A consolidated state dict is globally indexed (parameter ``i`` of the concatenated parameter
groups), exactly like a non-sharded optimizer's. That makes it independent of the world size:
on load, every rank recomputes the partition for the *current* world and keeps the entries of
the parameters it now owns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ferrodist.optim._shard_transfer import recv_shard, send_shard, snapshot

if TYPE_CHECKING:
    from ferrodist.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer


def local_state_by_global_index(zero: ZeroRedundancyOptimizer) -> dict[int, Any]:
    """This rank's optimizer state, keyed by global parameter index."""
    local = zero.optim.state_dict()
    global_groups = zero._partition_parameters()[zero.rank]
    if len(local["param_groups"]) != len(global_groups):
        raise AssertionError("Mismatch between number of local and global parameter groups")
    out: dict[int, Any] = {}
    for local_group, global_group in zip(local["param_groups"], global_groups):
        if len(local_group["params"]) != len(global_group["params"]):
            raise AssertionError(
                "Mismatch between number of local and global parameters in parameter group"
            )
        for local_index, param in zip(local_group["params"], global_group["params"]):
            if local_index in local["state"]:
                out[zero._param_to_index[param]] = local["state"][local_index]
    return out


def transport_device(zero: ZeroRedundancyOptimizer) -> torch.device:
    """Where shard tensors travel: CPU for gloo (its send/recv take CPU tensors only), the
    parameters' device for other backends (NCCL moves CUDA tensors only)."""
    try:
        backend = dist.get_backend(zero.process_group)
    except (RuntimeError, ValueError):
        backend = None
    return torch.device("cpu") if backend == "gloo" else zero._default_device


def consolidate(zero: ZeroRedundancyOptimizer, to: int) -> dict[int, Any] | None:
    """Send this rank's shard to group rank ``to``; on ``to``, return every shard merged.

    The receiving rank builds the output shard by shard as tensors arrive, so it never holds
    more than the output plus one header; its own shard is copied so the result stays a
    snapshot while training goes on.
    """
    if zero.rank != to:
        send_shard(
            local_state_by_global_index(zero),
            zero._global_rank(to),
            zero.process_group,
            transport_device(zero),
        )
        return None
    consolidated: dict[int, Any] = {}
    for rank in range(zero.world_size):
        if rank == zero.rank:
            consolidated.update(snapshot(local_state_by_global_index(zero)))
        else:
            consolidated.update(
                recv_shard(zero._global_rank(rank), zero.process_group, transport_device(zero))
            )
    return consolidated


def _to_device(value: Any, device: torch.device) -> Any:
    """A copy of ``value`` with every tensor on ``device`` (0-dim tensors stay on CPU)."""
    if isinstance(value, torch.Tensor):
        target = torch.device("cpu") if value.dim() == 0 else device
        return value.detach().to(target, copy=True)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_to_device(v, device) for v in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def load_owned_state(zero: ZeroRedundancyOptimizer, state_dict: dict[str, Any]) -> list[Any]:
    """Copy the entries of the parameters this rank owns into its local optimizer.

    Copies (not references) keep the caller's checkpoint unchanged while training goes on.
    Returns the owned parameters that received state.
    """
    owned = []
    for index, value in state_dict["state"].items():
        param = zero._index_to_param[index]
        if zero._param_to_rank[param] == zero.rank:
            zero.optim.state[param] = _to_device(value, param.device)
            owned.append(param)
    return owned
