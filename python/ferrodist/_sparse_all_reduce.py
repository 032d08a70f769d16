"""The SUM all-reduce of a sparse COO tensor on gloo, made of dense all-gathers.

Why not gloo's own: torch's gloo sparse all-reduce, run beside dense all-reduces (a DDP model
with a sparse embedding), corrupts the process's heap now and then: a gloo worker thread dies in
glibc's allocator, in torch's own DDP with no ferrodist code on its path (README, "DDP", and
``benches/RESULTS.md``). ferrodist reduces the same tensor the same way without that code: each
rank coalesces its input, the ranks all-gather each one's sizes and ``nnz``, then its indices and
values padded to the largest ``nnz`` (dense all-gathers, which the failing runs never faulted
in), and every rank sums the gathered tensors with the ATen calls gloo's work makes, in the same
(rank) order, so the result is the same to the bit: one sparse tensor per rank, added into the
first, coalesced, then copied into the input.

It is one call that returns when the sum is in the input; ``async_op=True`` gets a ``Work`` that
has already finished (torch's ``_create_work_from_future``), whose future yields ``[tensor]`` as
torch's does. The checks torch makes keep their classes and texts: non-matching sizes across
ranks raise ``RuntimeError("Sparse dimensions do not match")`` on every rank, after the sizes
are exchanged; reductions other than SUM never get here (torch rejects them itself).
"""

from __future__ import annotations

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
    if not tensor.is_cpu or op != _tdist.ReduceOp.SUM:
        return False
    if async_op and _work_from_future is None:  # torch before 2.1: no Work from a future
        return False
    if _c10d._rank_not_in_group(group):
        return False
    return "gloo" in str(_tdist.get_backend(group)).split(",")[0]


def sparse_all_reduce(
    tensor: torch.Tensor, group: Optional[Any] = None, async_op: bool = False
) -> Optional[Any]:
    """Sum the sparse ``tensor`` over ``group`` in place (see the module doc)."""
    with torch.no_grad():
        coalesced = tensor.coalesce()
        sizes = _gather_sizes(coalesced, group)
        if any(other[:-1] != sizes[_tdist.get_rank(group)][:-1] for other in sizes):
            raise RuntimeError("Sparse dimensions do not match")
        indices, values = _gather_entries(coalesced, [other[-1] for other in sizes], group)
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
    gathered = [torch.empty_like(mine) for _ in range(_tdist.get_world_size(group))]
    _tdist.all_gather(gathered, mine, group=group)
    return [tuple(int(x) for x in row.tolist()) for row in gathered]


def _gather_entries(
    tensor: torch.Tensor, nnz: list[int], group: Optional[Any]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every rank's indices ``[sparse_dim, nnz]`` and values ``[nnz, *dense]``, exchanged
    padded to the largest ``nnz``."""
    longest = max(nnz)
    dense_shape = tuple(tensor.shape[tensor.sparse_dim() :])
    indices = _padded(tensor.indices(), 1, longest)
    values = _padded(tensor.values(), 0, longest)
    all_indices = [torch.empty_like(indices) for _ in nnz]
    all_values = [torch.empty_like(values) for _ in nnz]
    _tdist.all_gather(all_indices, indices, group=group)
    _tdist.all_gather(all_values, values, group=group)
    return (
        [i.narrow(1, 0, n).contiguous() for i, n in zip(all_indices, nnz)],
        [v.narrow(0, 0, n).reshape((n, *dense_shape)) for v, n in zip(all_values, nnz)],
    )


def _padded(entries: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """``entries`` made contiguous and zero-padded to ``length`` along ``dim``."""
    shape = list(entries.shape)
    shape[dim] = length
    padded = entries.new_zeros(shape)
    padded.narrow(dim, 0, entries.shape[dim]).copy_(entries)
    return padded
