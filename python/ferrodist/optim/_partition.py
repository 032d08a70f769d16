"""Sorted-greedy partition of parameter groups across ranks, computed by the Rust core.

Every rank computes the same partition on its own (the algorithm is deterministic), so no
communication is needed to agree on who owns which parameter. See ``rust/partition.rs``.
"""

from __future__ import annotations

import copy
from typing import Any

from ferrodist import _native


def partition_param_groups(
    param_groups: list[dict[str, Any]], world_size: int
) -> list[list[dict[str, Any]]]:
    """Split every parameter group across ``world_size`` ranks.

    Args:
        param_groups: the optimizer's global parameter groups.
        world_size: number of ranks.

    Returns:
        ``result[rank]`` holds one shallow copy of each group (same hyper-parameters) whose
        ``"params"`` are the parameters that rank owns, largest first. A rank may own none of a
        group's parameters; it still gets the group, so local and global groups stay aligned.
    """
    sizes = [[p.numel() for p in group["params"]] for group in param_groups]
    assignment = _native.sorted_greedy_partition(sizes, world_size)
    result: list[list[dict[str, Any]]] = [[] for _ in range(world_size)]
    for group, per_rank in zip(param_groups, assignment):
        params = group["params"]
        for rank, indices in enumerate(per_rank):
            shard = copy.copy(group)
            shard["params"] = [params[i] for i in indices]
            result[rank].append(shard)
    return result
