"""Sparse all-reduces run by torch and by ferrodist on the same inputs (helper of
test_sparse_all_reduce).

Each side runs every case of :data:`CASES` in a gloo world of its own (torch's never loads
ferrodist: ``_torch_only_world``) and returns, per case, what the test compares: the reduced
tensor's indices, values, shape, dtype and coalesced flag, or the error's class and first line.
ferrodist is imported only by :func:`ferrodist_side`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist


def _random_sparse(
    seed: int, shape: tuple[int, ...], sparse_dim: int, nnz: int, dtype: torch.dtype
) -> torch.Tensor:
    """An uncoalesced sparse tensor: ``nnz`` entries drawn with repeats."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack(
        [torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dim)]
    )
    values_shape = (nnz, *shape[sparse_dim:])
    if dtype.is_floating_point:
        values = torch.randn(values_shape, generator=g, dtype=torch.float64).to(dtype)
    else:
        values = torch.randint(-50, 50, values_shape, generator=g).to(dtype)
    return torch.sparse_coo_tensor(
        indices.reshape(sparse_dim, nnz), values, shape, check_invariants=True
    )


def _input(case: str, rank: int) -> torch.Tensor:
    """This rank's input for ``case``."""
    if case == "embedding_rows":  # what DDP reduces for nn.Embedding(sparse=True)
        return _random_sparse(10 + rank, (40, 16), 1, 5 + 7 * rank, torch.float32)
    if case == "one_rank_empty":
        return _random_sparse(20 + rank, (1000,), 1, 0 if rank == 1 else 30, torch.float32)
    if case == "all_empty":
        return _random_sparse(30 + rank, (8, 3), 1, 0, torch.float32)
    if case == "hybrid_float64":  # two sparse dimensions, one dense
        return _random_sparse(40 + rank, (5, 6, 3), 2, 4 + rank, torch.float64)
    if case == "int64":
        return _random_sparse(50 + rank, (12,), 1, 9, torch.int64)
    if case == "bfloat16":
        return _random_sparse(60 + rank, (30, 4), 1, 11, torch.bfloat16)
    if case == "sizes_differ":  # rank 2's tensor is wider: every rank raises
        return _random_sparse(70 + rank, (40, 16 + (rank == 2)), 1, 3, torch.float32)
    raise KeyError(case)


CASES = [
    "embedding_rows",
    "one_rank_empty",
    "all_empty",
    "hybrid_float64",
    "int64",
    "bfloat16",
    "async",
    "max_is_refused",
    "in_a_coalescing_block",
    "sizes_differ",
]


def _outcome(tensor: torch.Tensor) -> dict[str, Any]:
    return {
        "indices": tensor._indices().tolist(),
        "values": tensor._values().tolist(),
        "values_bits": tensor._values().contiguous().view(-1).view(torch.uint8).tolist(),
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype),
        "coalesced": tensor.is_coalesced(),
    }


def _run(case: str, all_reduce: Callable[..., Any]) -> dict[str, Any]:
    rank = dist.get_rank()
    try:
        if case == "async":
            tensor = _input("embedding_rows", rank)
            work = all_reduce(tensor, async_op=True)
            finished = work.wait()
            dist.barrier()
            value = work.get_future().value()
            out = _outcome(tensor)
            out["async"] = {
                "wait": finished,
                "completed": work.is_completed(),
                "future_holds_the_input": len(value) == 1 and value[0] is tensor,
            }
            return out
        if case == "in_a_coalescing_block":  # only queued there: torch's own call takes it
            from torch.distributed.distributed_c10d import _coalescing_manager

            with _coalescing_manager():
                all_reduce(_input("embedding_rows", rank))
            return {"error": None}
        if case == "max_is_refused":
            all_reduce(_input("embedding_rows", rank), op=dist.ReduceOp.MAX)
            return {"error": None}
        tensor = _input(case, rank)
        all_reduce(tensor)
        dist.barrier()
        return _outcome(tensor)
    except Exception as e:
        # No barrier after a failure: torch's barrier waits for gloo's earlier works, and a
        # failed one still in its list raises its error again there (a race of torch's).
        return {"error": (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}


def torch_side() -> dict[str, Any]:
    """Every case through ``torch.distributed.all_reduce``."""
    return {case: _run(case, dist.all_reduce) for case in CASES}


def ferrodist_side() -> dict[str, Any]:
    """Every case through ``ferrodist.all_reduce``, and what its flight recorder saw."""
    import ferrodist

    out: dict[str, Any] = {case: _run(case, ferrodist.all_reduce) for case in CASES}
    recorder = ferrodist.debug.recorder()
    out["recorded_ops"] = [e["op"] for e in recorder.entries()] if recorder is not None else None
    return out


def _gloo_works_of_sparse_ddp(ddp_cls: Any) -> list[str]:
    """The gloo works (their profiler names) that three steps of a DDP model with a sparse
    embedding start."""
    rank = dist.get_rank()
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Embedding(40, 16, sparse=True), torch.nn.Linear(16, 4))
    model = ddp_cls(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(3):
            ids = torch.randint(0, 40, (8,), generator=torch.Generator().manual_seed(rank + step))
            model(ids).square().mean().backward()
            opt.step()
            opt.zero_grad()
    return sorted({e.name for e in prof.events() if e.name.startswith("gloo:")})


def torch_ddp_gloo_works() -> list[str]:
    """The gloo works of torch's DDP on a sparse embedding."""
    from torch.nn.parallel import DistributedDataParallel

    return _gloo_works_of_sparse_ddp(DistributedDataParallel)


def ferrodist_ddp_gloo_works() -> list[str]:
    """The gloo works of ferrodist's DDP on a sparse embedding."""
    from ferrodist.nn import DistributedDataParallel

    return _gloo_works_of_sparse_ddp(DistributedDataParallel)
