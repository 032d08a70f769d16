"""DDP communication hooks that run ``ZeroRedundancyOptimizer``'s step inside backward.

Wrap a gradient hook (e.g. ``allreduce_hook``) with :func:`hook_with_zero_step` or
:func:`hook_with_zero_step_interleaved` and register it on the DDP model; ZeRO must be built with
``overlap_with_ddp=True``. Iteration 1 runs with DDP's first-iteration buckets; DDP rebuilds its
buckets before iteration 2, whose hook calls record them; iteration 3 initialises ZeRO on them
and steps from then on. So the first two iterations update no parameter (as in torch).

Difference from torch: these hooks also work on gloo. torch refuses gloo ("may meet hangs")
because its interleaved hook broadcasts from inside a future callback, where the order of
collectives can differ between ranks and a gloo worker may wait on itself. Here every broadcast
is issued from the hook itself, in bucket order, on the thread that runs DDP's backward; future
callbacks only do optimizer arithmetic.
"""

import threading
import weakref
from collections.abc import Callable
from typing import Any, List, Optional

import torch
import torch.distributed as dist

from ferrodist.optim._overlap_state import _OverlapStatus
from ferrodist.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer

__all__ = ["hook_with_zero_step", "hook_with_zero_step_interleaved"]

_Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def _perform_local_step(bucket: dist.GradBucket, zero: ZeroRedundancyOptimizer, rank: int) -> None:
    """Step the parameters of ``bucket`` that ``rank`` owns, with the bucket's reduced grads."""
    info = zero._overlap_info
    index = bucket.index()
    if len(zero.optim.param_groups) != 1:
        raise AssertionError("Overlapping DDP with ZeRO only supports a single parameter group")
    if index not in info.offsets:
        raise AssertionError(f"Bucket index {index} was not assigned to rank {rank}")
    gradients: List[Optional[torch.Tensor]] = [None] * len(zero.optim.param_groups[0]["params"])
    start = info.offsets[index]
    assignment = zero._bucket_assignments_per_rank[rank][index]
    length = len(assignment.parameters)
    grads = bucket.gradients()[assignment.offset : assignment.offset + length]
    gradients[start : start + length] = grads
    zero._local_step(gradients)


def _broadcast_bucket(bucket_index: int, zero: ZeroRedundancyOptimizer) -> None:
    """Start the broadcasts of every rank's slice of one bucket (ascending rank order)."""
    info = zero._overlap_info
    owners = sorted(info.assigned_ranks_per_bucket[bucket_index])
    if not owners:
        raise AssertionError(f"Bucket {bucket_index} should be assigned to at least one rank")
    for owner in owners:
        tensor = zero._bucket_assignments_per_rank[owner][bucket_index].tensor
        if tensor is None:
            raise AssertionError(f"bucket {bucket_index} of rank {owner} was never flattened")
        info.broadcast_handles.append(
            dist.broadcast(
                tensor, src=zero._global_rank(owner), group=zero.process_group, async_op=True
            )
        )


def _save_ddp_bucket_info(bucket: dist.GradBucket, zero: ZeroRedundancyOptimizer) -> None:
    params = bucket.parameters()
    if not params:
        raise AssertionError("Empty bucket")
    info = zero._overlap_info
    info.params_per_bucket.append(params)
    if info.shard_buckets:
        info.total_size = (info.total_size or 0) + sum(p.numel() for p in params)


def _hook_with_zero_step_setup(
    ddp_ref: "weakref.ReferenceType[Any]", zero: ZeroRedundancyOptimizer, bucket: dist.GradBucket
) -> None:
    """Advance the delayed initialisation: record DDP's rebuilt buckets, then initialise."""
    ddp = ddp_ref()
    if ddp is None or not ddp._has_rebuilt_buckets:
        if zero._overlap_info.status != _OverlapStatus.UNINITIALIZED:
            raise AssertionError("ZeRO overlap initialised before DDP rebuilt its buckets")
        return
    info = zero._overlap_info
    if info.status == _OverlapStatus.UNINITIALIZED:
        info.status = _OverlapStatus.DDP_HAS_REBUILT_BUCKETS
    if info.status == _OverlapStatus.DDP_HAS_REBUILT_BUCKETS:
        if bucket.index() == 0 and info.params_per_bucket:
            zero._init_zero_for_overlap()
        else:
            _save_ddp_bucket_info(bucket, zero)


def _validate(
    ddp: Any, zero: ZeroRedundancyOptimizer, shard_buckets: bool
) -> "weakref.ReferenceType[Any]":
    if not zero._overlap_with_ddp:
        raise ValueError(
            "ZeroRedundancyOptimizer must be constructed with `overlap_with_ddp=True` to use "
            "this hook properly"
        )
    if shard_buckets:
        zero._overlap_info.shard_buckets = True
        zero._overlap_info.total_size = 0
    return weakref.ref(ddp)


def _record_bucket(zero: ZeroRedundancyOptimizer, bucket_index: int) -> None:
    seen = zero._overlap_info.bucket_indices_seen
    if seen and seen[-1] != bucket_index - 1:
        raise AssertionError("Bucket indices are not in incremental order")
    if not seen and bucket_index != 0:
        raise AssertionError("Bucket indices do not start from 0")
    seen.append(bucket_index)


def hook_with_zero_step(
    hook: _Hook, ddp: Any, zero: ZeroRedundancyOptimizer, shard_buckets: bool = False
) -> _Hook:
    """Wrap ``hook`` so ZeRO steps once the last bucket is reached, overlapping the remaining
    all-reduces and the parameter broadcasts.

    Args:
        hook: the gradient hook to wrap (it still reduces the gradients).
        ddp: the DDP model (held by weak reference).
        zero: a ``ZeroRedundancyOptimizer(..., overlap_with_ddp=True)``.
        shard_buckets: split DDP buckets over several ranks to balance the work.

    Raises:
        ValueError: ``zero`` was built without ``overlap_with_ddp=True``.
    """
    ddp_ref = _validate(ddp, zero, shard_buckets)

    def hook_with_zero_fn(
        state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        fut = hook(state, bucket)
        _hook_with_zero_step_setup(ddp_ref, zero, bucket)
        info = zero._overlap_info
        if info.status != _OverlapStatus.INITIALIZED:
            return fut
        index = bucket.index()
        rank = zero.rank
        if rank in info.assigned_ranks_per_bucket[index]:
            info.bucket_index_to_bucket[index] = bucket
            info.bucket_index_to_future[index] = fut
        _record_bucket(zero, index)
        num_buckets = len(info.params_per_bucket)
        if index != num_buckets - 1:
            return fut
        for i in range(num_buckets):
            if rank in info.assigned_ranks_per_bucket[i]:
                info.bucket_index_to_future[i].wait()
                _perform_local_step(info.bucket_index_to_bucket[i], zero, rank)
            _broadcast_bucket(i, zero)
        info.wait_for_broadcasts()
        info.clear_per_iter_info()
        return fut

    return hook_with_zero_fn


def hook_with_zero_step_interleaved(
    hook: _Hook, ddp: Any, zero: ZeroRedundancyOptimizer, shard_buckets: bool = False
) -> _Hook:
    """Wrap ``hook`` so each bucket's share of ZeRO's step runs as soon as that bucket is reduced.

    The optimizer arithmetic of bucket ``i`` runs in a callback of bucket ``i``'s reduction,
    overlapping the backward computation of later buckets. The broadcasts are issued in bucket
    order by the last bucket's hook call (never from a callback), which keeps the collective
    order identical on every rank; this is why the hook is safe on gloo.

    Args and Raises: as :func:`hook_with_zero_step`.
    """
    ddp_ref = _validate(ddp, zero, shard_buckets)
    step_lock = threading.Lock()

    def hook_with_zero_interleaved_fn(
        state: Any, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        fut = hook(state, bucket)
        _hook_with_zero_step_setup(ddp_ref, zero, bucket)
        info = zero._overlap_info
        if info.status != _OverlapStatus.INITIALIZED:
            return fut
        index = bucket.index()
        rank = zero.rank
        _record_bucket(zero, index)

        def zero_step(done: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            done.value()  # re-raise a failed reduction
            if rank in info.assigned_ranks_per_bucket[index]:
                with step_lock:
                    _perform_local_step(bucket, zero, rank)
            return bucket.buffer()

        stepped = fut.then(zero_step)
        info.bucket_index_to_future[index] = stepped
        if index != len(info.params_per_bucket) - 1:
            return stepped
        for i in range(len(info.params_per_bucket)):
            info.bucket_index_to_future[i].wait()
            _broadcast_bucket(i, zero)
        info.wait_for_broadcasts()
        info.clear_per_iter_info()
        return stepped

    return hook_with_zero_interleaved_fn
