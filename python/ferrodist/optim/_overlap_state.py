"""Bookkeeping for ``ZeroRedundancyOptimizer(overlap_with_ddp=True)``.

In overlap mode ZeRO's step runs inside DDP's communication hook, bucket by bucket, so ZeRO must
partition parameters the way DDP bucketed them: each DDP gradient bucket (or, with
``shard_buckets=True``, each contiguous slice of one) belongs to one rank. DDP only settles its
buckets after the first iteration, so the hook first records them and ZeRO initialises late.
The bucket-to-rank assignment itself is computed by the Rust core (``rust/partition.rs``).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from ferrodist import _native


class _OverlapStatus(enum.IntEnum):
    """How far the delayed initialisation of overlap mode has progressed."""

    UNINITIALIZED = 0  # DDP has not rebuilt its buckets yet
    DDP_HAS_REBUILT_BUCKETS = 1  # buckets are being recorded during this backward
    INITIALIZED = 2  # ZeRO is partitioned by bucket and its local optimizer exists


class _DDPBucketAssignment:
    """A contiguous run of one DDP bucket's parameters owned by one rank.

    Attributes:
        bucket_index: the DDP bucket's index.
        parameters: the parameters of the run, in bucket order.
        offset: index of ``parameters[0]`` within the bucket.
        device: the parameters' device (DDP buckets hold one device and dtype).
        tensor: flat tensor the parameters are views into; broadcast after the owner steps.
    """

    def __init__(self, bucket_index: int, parameters: list[torch.Tensor], offset: int) -> None:
        if not parameters:
            raise ValueError("Empty bucket assignment")
        self.bucket_index = bucket_index
        self.parameters = parameters
        self.offset = offset
        self.device = parameters[0].device
        self.tensor: torch.Tensor | None = None


class _OverlapInfo:
    """State shared by ZeRO and the DDP hook in overlap mode.

    The first group of attributes is set once at initialisation; the second is per iteration.
    Ranks are ranks *within ZeRO's process group* throughout (torch mixes in global ranks, which
    is only right for the default group).
    """

    def __init__(self, world_size: int) -> None:
        self.status: _OverlapStatus = _OverlapStatus.UNINITIALIZED
        self.shard_buckets: bool = False
        self.params_per_bucket: list[list[torch.Tensor]] = []
        self.params_per_rank: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
        self.offsets: dict[int, int] = {}
        self.assigned_ranks_per_bucket: list[set[int]] = []
        self.num_bucket_assignments: int = 0
        self.total_size: int | None = None
        self.broadcast_handles: list[Any] = []
        self.bucket_index_to_future: dict[int, torch.futures.Future] = {}
        self.bucket_index_to_bucket: dict[int, Any] = {}
        self.bucket_indices_seen: list[int] = []

    def wait_for_broadcasts(self) -> None:
        """Wait for this iteration's parameter broadcasts, then forget them."""
        if len(self.broadcast_handles) != self.num_bucket_assignments:
            raise AssertionError(
                f"Missing at least one broadcast handle: {len(self.broadcast_handles)} of "
                f"{self.num_bucket_assignments}"
            )
        for handle in self.broadcast_handles:
            handle.wait()
        self.broadcast_handles.clear()

    def clear_per_iter_info(self) -> None:
        """Reset what the hook collects during one iteration."""
        self.bucket_index_to_future.clear()
        self.bucket_index_to_bucket.clear()
        self.bucket_indices_seen.clear()


def assign_buckets(
    info: _OverlapInfo, world_size: int, rank: int
) -> list[dict[int, _DDPBucketAssignment]]:
    """Assign the recorded DDP buckets to ranks; fills ``info`` and returns per-rank assignments.

    Args:
        info: overlap state with ``params_per_bucket`` recorded.
        world_size: ranks in ZeRO's group.
        rank: this process's rank in that group (decides ``info.offsets``).
    """
    sizes = [[p.numel() for p in params] for params in info.params_per_bucket]
    # An empty bucket, or more slices of one than ranks, raises AssertionError as torch's does.
    slices = _native.assign_ddp_buckets(sizes, world_size, info.shard_buckets)
    per_rank: list[dict[int, _DDPBucketAssignment]] = [{} for _ in range(world_size)]
    info.assigned_ranks_per_bucket = [set() for _ in info.params_per_bucket]
    info.params_per_rank = [[] for _ in range(world_size)]
    info.offsets = {}
    info.num_bucket_assignments = 0
    for bucket, owner, offset, length in slices:
        params = info.params_per_bucket[bucket][offset : offset + length]
        per_rank[owner][bucket] = _DDPBucketAssignment(bucket, params, offset)
        if owner == rank:
            info.offsets[bucket] = len(info.params_per_rank[owner])
        info.params_per_rank[owner].extend(params)
        info.assigned_ranks_per_bucket[bucket].add(owner)
        info.num_bucket_assignments += 1
    return per_rank


def flatten_assignments(assignments_per_rank: list[dict[int, _DDPBucketAssignment]]) -> None:
    """Give every assignment a flat tensor and make its parameters views into it."""
    for assignments in assignments_per_rank:
        for assignment in assignments.values():
            params = assignment.parameters
            if not all(p.requires_grad for p in params):
                raise AssertionError(
                    "Model parameter corresponding to a gradient in a DDP bucket should require "
                    "a gradient"
                )
            tensor = torch.empty(
                sum(p.numel() for p in params), dtype=params[0].dtype, device=assignment.device
            )
            offset = 0
            for param in params:
                end = offset + param.numel()
                tensor[offset:end].copy_(param.data.flatten())
                param.data = tensor[offset:end].view_as(param.data)
                offset = end
            assignment.tensor = tensor
