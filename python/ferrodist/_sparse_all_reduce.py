"""The SUM all-reduce of a sparse COO tensor on gloo, made of dense all-gathers.

Why not gloo's own: torch's gloo sparse all-reduce, run beside dense all-reduces (a DDP model
with a sparse embedding), corrupts the process's heap now and then: a gloo worker thread dies in
glibc's allocator, in torch's own DDP with no ferrodist code on its path (README, "DDP", and
``benches/RESULTS.md``). ferrodist reduces the same tensor the same way without that code: each
rank coalesces its input, the ranks all-gather each one's sizes and ``nnz``, then its indices and
values as bytes padded to the largest rank's (two dense all-gathers, which the failing runs never
faulted in; gloo's makes three exchanges), and every rank sums the gathered tensors with the
ATen calls gloo's work makes, in the same (rank) order, so the result is the same to the bit:
one sparse tensor per rank, added into the first, coalesced, then copied into the input.

It is one call that returns when the sum is in the input; ``async_op=True`` gets a ``Work`` that
has already finished (torch's ``_create_work_from_future``), whose future yields ``[tensor]`` as
torch's does. The checks torch makes keep their classes and texts: non-matching sizes across
ranks raise ``RuntimeError("Sparse dimensions do not match")`` on every rank, after the sizes
are exchanged; reductions other than SUM, complex values, a call inside torch's coalescing block
and a rank outside the group never get here (torch's own all_reduce takes them as it does).
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.distributed as _tdist
import torch.distributed.distributed_c10d as _c10d

__all__ = ["handles", "sparse_all_reduce"]

_MAX_DIMS = 4
"""torch's gloo work carries at most four sparse and four dense dimensions."""

_work_from_future = getattr(torch._C._distributed_c10d, "_create_work_from_future", None)


def handles(tensor: Any, op: Any, group: Any, async_op: bool) -> bool:
    """Whether ``all_reduce(tensor, op, group, async_op)`` is a sparse SUM on gloo that
    :func:`sparse_all_reduce` makes (anything else goes to torch as it is)."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        return False
    if not tensor.is_cpu or tensor.is_complex() or op != _tdist.ReduceOp.SUM:
        return False
    if async_op and _work_from_future is None:  # torch before 2.1: no Work from a future
        return False
    if not _tdist.is_initialized() or _c10d._rank_not_in_group(group):
        return False  # torch says what is wrong, or does nothing, as it does for any tensor
    # Inside torch's coalescing block an op is only queued: torch's own all_reduce queues it.
    queued = getattr(_c10d._world, "pg_coalesce_state", {})
    if (group if group is not None else _c10d._get_default_group()) in queued:
        return False
    backend = str(_tdist.get_backend(group))  # "gloo", or per device: "cpu:gloo,cuda:nccl"
    return backend == "gloo" or "cpu:gloo" in backend.split(",")


def sparse_all_reduce(
    tensor: torch.Tensor, group: Optional[Any] = None, async_op: bool = False
) -> Optional[Any]:
    """Sum the sparse ``tensor`` over ``group`` in place (see the module doc)."""
    with torch.no_grad():
        coalesced = tensor.coalesce()
        rank = _tdist.get_rank(group)
        sizes = _gather_sizes(coalesced, group)
        if any(other[:-1] != sizes[rank][:-1] for other in sizes):
            raise RuntimeError("Sparse dimensions do not match")
        nnz = [other[-1] for other in sizes]
        indices, values = _gather_entries(coalesced, nnz, rank, group)
        shape = coalesced.shape
        output = torch.sparse_coo_tensor(indices[0], values[0], shape, check_invariants=False)
        for rank_indices, rank_values in zip(indices[1:], values[1:]):
            output += torch.sparse_coo_tensor(
                rank_indices, rank_values, shape, check_invariants=False
            )
        tensor.copy_(output.coalesce())
    if not async_op:
        return None
    future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
    future.set_result([tensor])
    return _work_from_future(future)  # type: ignore[misc]


def _gather_sizes(tensor: torch.Tensor, group: Optional[Any]) -> list[tuple[int, ...]]:
    """Every rank's ``(sparse_dim, dense_dim, *sizes padded to 8, nnz)``."""
    sparse_dim, dense_dim = tensor.sparse_dim(), tensor.dense_dim()
    if sparse_dim > _MAX_DIMS or dense_dim > _MAX_DIMS:
        raise RuntimeError(
            "all_reduce of a sparse tensor takes at most 4 sparse and 4 dense dimensions, "
            f"got {sparse_dim} and {dense_dim}"
        )
    shape = list(tensor.shape) + [-1] * (2 * _MAX_DIMS - tensor.dim())
    mine = torch.tensor([sparse_dim, dense_dim, *shape, tensor._nnz()], dtype=torch.long)
    return [tuple(row) for row in _all_gather_rows(mine, group).tolist()]


def _gather_entries(
    tensor: torch.Tensor, nnz: list[int], rank: int, group: Optional[Any]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's indices ``[sparse_dim, nnz]`` and values ``[nnz, *dense]``, exchanged in one
    all-gather of bytes: each rank's indices then values, padded to the largest rank's
    (``rank``: this one's place in ``group``)."""
    sparse_dim = tensor.sparse_dim()
    dense_shape = tuple(tensor.shape[sparse_dim:])
    values_dtype = tensor.values().dtype
    index_bytes = [_aligned(n * sparse_dim * 8) for n in nnz]
    value_size = math.prod(dense_shape) * values_dtype.itemsize
    # never empty: an empty exchange's rows would have no aligned offsets to view
    row = max(16, *(i + _aligned(n * value_size) for i, n in zip(index_bytes, nnz)))
    mine = torch.empty(row, dtype=torch.uint8)
    ends = (
        _put_bytes(mine, 0, tensor.indices()),
        _put_bytes(mine, index_bytes[rank], tensor.values()),
    )
    mine[ends[0] : index_bytes[rank]].zero_()  # no stale memory of this process goes out
    mine[ends[1] :].zero_()
    indices, values = [], []
    for raw, n, start in zip(_all_gather_rows(mine, group), nnz, index_bytes):
        indices.append(raw[: n * sparse_dim * 8].view(torch.long).view(sparse_dim, n))
        values.append(raw[start : start + n * value_size].view(values_dtype).view(n, *dense_shape))
    return indices, values


def _all_gather_rows(mine: torch.Tensor, group: Optional[Any]) -> torch.Tensor:
    """Every rank's 1-D ``mine`` (all of one length), one row each, in rank order."""
    world = _tdist.get_world_size(group)
    flat = mine.new_empty(world * mine.numel())  # gloo splits a flat output, not rows
    _tdist.all_gather_into_tensor(flat, mine, group=group)
    return flat.view(world, mine.numel())


def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 16, so that every part starts aligned for any
    dtype (a view of bytes as a wider type needs its offset to be a multiple of its size)."""
    return -(-nbytes // 16) * 16


def _put_bytes(buffer: torch.Tensor, offset: int, entries: torch.Tensor) -> int:
    """Copy ``entries``' elements, in order, as bytes into ``buffer`` at ``offset``; where
    they end."""
    flat = entries.contiguous().view(-1)
    nbytes = flat.numel() * flat.element_size()
    buffer.narrow(0, offset, nbytes).copy_(flat.view(torch.uint8))
    return offset + nbytes
