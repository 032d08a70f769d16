"""Agreeing on the rebuilt buckets: every rank adopts rank 0's layout.

Ranks can see gradients arrive in different orders, so each would compute different buckets;
collectives then pair up the wrong tensors. Rank 0's layout is broadcast as one int64 tensor:
``[n, size_0..size_{n-1}, limit_0..limit_{n-1}, indices...]``, preceded by its length.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as tdist

from ferrodist._recorded_ops import collective

_broadcast = collective("ddp.broadcast", tdist.broadcast, "tensor")


def _global_rank(process_group: Any, group_rank: int) -> int:
    if process_group is None or process_group is tdist.GroupMember.WORLD:
        return group_rank
    return int(tdist.get_global_rank(process_group, group_rank))


def broadcast_bucket_layout(
    process_group: Any, indices: list[list[int]], limits: list[int], device: torch.device
) -> tuple[list[list[int]], list[int]]:
    """Rank 0's ``(bucket_indices, per_bucket_size_limits)``, on every rank of the group."""
    src = _global_rank(process_group, 0)
    flat = [len(indices), *map(len, indices), *limits, *(i for b in indices for i in b)]
    count = torch.tensor([len(flat)], dtype=torch.int64, device=device)
    _broadcast(count, src=src, group=process_group)
    payload = torch.tensor(flat, dtype=torch.int64, device=device)
    if int(count.item()) != len(flat):
        payload = torch.zeros(int(count.item()), dtype=torch.int64, device=device)
    _broadcast(payload, src=src, group=process_group)
    values = payload.tolist()
    n = values[0]
    sizes, agreed_limits = values[1 : 1 + n], values[1 + n : 1 + 2 * n]
    pos, agreed = 1 + 2 * n, []
    for size in sizes:
        agreed.append(values[pos : pos + size])
        pos += size
    return agreed, agreed_limits
