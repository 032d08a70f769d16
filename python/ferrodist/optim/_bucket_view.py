"""Flat parameter buckets for ``parameters_as_bucket_view=True``.

Per device and per rank, the trainable parameters that rank owns are copied into one flat
tensor and each parameter's ``.data`` becomes a view into it. Syncing parameters after a step
is then one broadcast per (device, rank) instead of one per parameter. Frozen parameters are
cloned out of any earlier bucket so a rebuild never leaves them aliasing freed storage.
"""

from __future__ import annotations

from typing import Any

import torch


def params_per_device_per_rank(
    partition: list[list[dict[str, Any]]],
) -> dict[torch.device, list[list[torch.Tensor]]]:
    """Group each rank's owned parameters by device, devices in first-seen order."""
    world_size = len(partition)
    by_device: dict[torch.device, list[list[torch.Tensor]]] = {}
    for rank, groups in enumerate(partition):
        for group in groups:
            for param in group["params"]:
                per_rank = by_device.setdefault(param.device, [[] for _ in range(world_size)])
                per_rank[rank].append(param)
    return by_device


def flatten_into_bucket(params: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Copy ``params`` (trainable ones) into one flat tensor and re-point them at views of it.

    Returns a ``zeros(1)`` placeholder when no parameter is trainable, so every rank still takes
    part in the same number of broadcasts.
    """
    trainable: list[torch.Tensor] = []
    dtype = None
    for param in params:
        dtype = param.dtype
        if param.requires_grad:
            trainable.append(param)
        else:
            param.data = param.data.detach().clone()
    numel = sum(p.numel() for p in trainable)
    if numel == 0:
        return torch.zeros(1, device=device)
    bucket = torch.empty(numel, dtype=dtype, device=device)
    offset = 0
    for param in trainable:
        end = offset + param.numel()
        bucket[offset:end].copy_(param.data.flatten())
        param.data = bucket[offset:end].view_as(param.data)
        offset = end
    return bucket


def build_buckets(partition: list[list[dict[str, Any]]]) -> list[list[torch.Tensor]]:
    """``buckets[device_index][rank]``: one flat tensor per device and rank."""
    return [
        [flatten_into_bucket(params, device) for params in per_rank]
        for device, per_rank in params_per_device_per_rank(partition).items()
    ]
