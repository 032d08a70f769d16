"""One rank of the world started by test_ddp_torch_parity.py: ferrodist's DDP step by step
against torch's own DDP, for ``skip_all_reduce_unused_params`` and sparse gradients.

Each scenario builds one model, wraps a copy in torch's DDP and a copy in ferrodist's with the
same options, trains both on the same rank-dependent batches and, after every backward, checks
that each parameter's gradient is bitwise torch's (same layout; a sparse gradient down to its
uncoalesced indices and values; ``None`` where torch's is ``None``), then that the parameters
after the optimizer step are bitwise equal too, and that the Logger's ``num_buckets_reduced``
agrees. Every scenario prints ``RESULT name PASS`` or ``RESULT name FAIL why``.
"""

from __future__ import annotations

import copy
import sys
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _scenario_world import run_scenarios
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ferrodist.algorithms.ddp_comm_hooks import default_hooks as fd_hooks
from ferrodist.nn import DistributedDataParallel as FerroDDP

STEPS = 4


class WithSpare(nn.Module):
    """An MLP and a ``spare`` layer that forward uses only when told to.

    ``spare`` (one weight, no bias) comes first so that, buckets being filled in parameter
    order, a ``bucket_cap_mb`` of 0.002 closes a bucket right after it: a bucket of its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.spare = nn.Linear(48, 48, bias=False)
        self.inp = nn.Linear(12, 48)
        self.mid = nn.Linear(48, 48)
        self.out = nn.Linear(48, 3)

    def forward(self, x: torch.Tensor, use_spare: bool = False) -> torch.Tensor:
        h = torch.relu(self.mid(torch.relu(self.inp(x))))
        if use_spare:
            h = h + self.spare(h)
        return self.out(h)


class SparseBag(nn.Module):
    """torch's own sparse-gradient test model: a sparse EmbeddingBag, then a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(10, 10, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.embedding(x), dim=1)


class SparseAndDense(nn.Module):
    """A sparse embedding feeding dense layers: sparse and dense buckets in one DDP."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8, sparse=True)
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc(self.emb(x).mean(1))))


def _same_grad(name: str, ours: Optional[torch.Tensor], theirs: Optional[torch.Tensor]) -> None:
    if theirs is None or ours is None:
        assert ours is None and theirs is None, f"{name}: grad {ours} vs torch's {theirs}"
        return
    assert ours.layout == theirs.layout, f"{name}: layout {ours.layout} vs {theirs.layout}"
    if theirs.layout == torch.sparse_coo:
        assert ours.is_coalesced() == theirs.is_coalesced(), f"{name}: coalesced differs"
        assert torch.equal(ours._indices(), theirs._indices()), f"{name}: sparse indices"
        assert torch.equal(ours._values(), theirs._values()), f"{name}: sparse values"
    else:
        assert torch.equal(ours, theirs), f"{name}: max |diff| {(ours - theirs).abs().max()}"


def _sparse_gloo_hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """torch's sparse-gradient hook test: all-reduce the buffer, divide in a callback."""
    world = dist.get_world_size()
    fut = dist.group.WORLD.allreduce([bucket.buffer()]).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.wait()[0] / world)


def compare(
    make: Callable[[], nn.Module],
    batches: Callable[[int, int], tuple[Any, ...]],
    loss_of: Callable[[torch.Tensor, tuple[Any, ...]], torch.Tensor],
    ddp: dict[str, Any],
    hook: Optional[str] = None,
    zero_grad: Callable[[int], Optional[bool]] = lambda step: True,
    steps: int = STEPS,
    bucket_log: Optional[dict[str, list[Any]]] = None,
) -> Any:
    """Train torch's and ferrodist's DDP side by side; assert bitwise agreement each step.

    ``batches(step, rank)`` gives the forward's arguments (and the target), ``loss_of(out, b)``
    the loss; ``zero_grad(step)`` says how the gradients are cleared after the step: ``True``
    set to None, ``False`` zeroed in place, ``None`` left to accumulate. Returns ferrodist's
    DDP.
    """
    rank = dist.get_rank()
    torch.manual_seed(3 + rank)  # different inits per rank: DDP's broadcast must fix them
    base = make()
    runs = []
    for kind, cls, hooks in (("torch", TorchDDP, torch_hooks), ("ferrodist", FerroDDP, fd_hooks)):
        net = copy.deepcopy(base)
        wrapped = cls(net, **ddp)
        if hook == "allreduce":
            wrapped.register_comm_hook(None, hooks.allreduce_hook)
        elif hook == "sparse_gloo":
            log = {} if bucket_log is None else bucket_log
            seen: list[Any] = log.setdefault(kind, [])
            handed: list[Any] = log.setdefault(f"{kind} buffers", [])

            def logged(state, bucket, seen=seen, handed=handed):  # type: ignore[no-untyped-def]  # DDP checks annotations
                grads = bucket.gradients()
                params = bucket.parameters()
                handed.append((bucket.buffer(), params))
                seen.append(
                    (
                        bucket.index(),
                        [g.layout for g in grads],
                        len(params),
                        # the buffer of a sparse bucket is the gradient itself
                        [bucket.buffer() is p.grad for p in params],
                    )
                )
                return _sparse_gloo_hook(state, bucket)

            wrapped.register_comm_hook(None, logged)
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
        runs.append((kind, net, wrapped, opt))
    for step in range(steps):
        batch = batches(step, rank)
        for kind, _, wrapped, _ in runs:
            loss_of(wrapped(*batch[:-1]), batch).backward()
            if bucket_log is not None:  # is each sparse .grad still the tensor the hook had?
                handed = bucket_log[f"{kind} buffers"]
                bucket_log.setdefault(f"{kind} after", []).append(
                    [b is p.grad for b, params in handed if b.is_sparse for p in params]
                )
                handed.clear()
        (_, t_net, t_ddp, _), (_, f_net, f_ddp, _) = runs
        for (name, tp), fp in zip(t_net.named_parameters(), f_net.parameters()):
            _same_grad(f"step {step} {name}", fp.grad, tp.grad)
        t_data, f_data = t_ddp._get_ddp_logging_data(), f_ddp._get_ddp_logging_data()
        # torch logs it since it has skip_all_reduce_unused_params (not 2.4); ours always does.
        reduced = t_data.get("num_buckets_reduced", f_data.get("num_buckets_reduced"))
        assert f_data.get("num_buckets_reduced") == reduced, (
            f"step {step}: num_buckets_reduced {f_data.get('num_buckets_reduced')} vs "
            f"torch's {t_data.get('num_buckets_reduced')}"
        )
        clear = zero_grad(step)
        for _, _, _, opt in runs:
            opt.step()
            if clear is not None:
                opt.zero_grad(set_to_none=clear)
        for (name, tp), fp in zip(t_net.named_parameters(), f_net.parameters()):
            assert torch.equal(fp, tp), f"step {step} {name}: parameters differ"
    if bucket_log is not None:
        for key in ("", " after"):
            ours, theirs = bucket_log[f"ferrodist{key}"], bucket_log[f"torch{key}"]
            assert ours == theirs, f"hook's view{key}: {ours} vs torch's {theirs}"
    return runs[1][2]


# ---- skip_all_reduce_unused_params ----------------------------------------------------------


def _spare_batches(use: Callable[[int], bool]) -> Callable[[int, int], tuple[Any, ...]]:
    def batches(step: int, rank: int) -> tuple[Any, ...]:
        g = torch.Generator().manual_seed(100 * step + rank)
        return (torch.randn(6, 12, generator=g), use(step), None)

    return batches


def _square_mean(out: torch.Tensor, _batch: tuple[Any, ...]) -> torch.Tensor:
    return out.square().mean()


def _skip(ddp: dict[str, Any], use: Callable[[int], bool] = lambda step: False, **kw: Any) -> Any:
    options = {"find_unused_parameters": True, "skip_all_reduce_unused_params": True}
    options.update(ddp)
    return compare(WithSpare, _spare_batches(use), _square_mean, options, **kw)


def skip_unused() -> None:
    """The spare layer never used, its own buckets (small cap): they are never reduced."""
    ddp = _skip({"bucket_cap_mb": 0.002})
    reduced = ddp._get_ddp_logging_data()["num_buckets_reduced"]
    assert 0 < reduced < len(ddp.reducer._buckets), "no bucket was skipped"


def skip_unused_one_bucket() -> None:
    """Default bucket cap: the spare layer shares a bucket with used ones, which is reduced."""
    _skip({})


def skip_unused_hook() -> None:
    """The same through torch's ``allreduce_hook`` (each DDP with its package's hook)."""
    _skip({"bucket_cap_mb": 0.002}, hook="allreduce")


def skip_unused_alternating() -> None:
    """Used by every rank on even steps only: reduced then, skipped (grads kept) on odd ones."""
    _skip({"bucket_cap_mb": 0.002}, use=lambda step: step % 2 == 0, zero_grad=lambda s: None)


def skip_unused_bucket_view() -> None:
    """``gradient_as_bucket_view`` with gradients zeroed in place or left to accumulate: an
    unused parameter's gradient is already the bucket view, divided there though not reduced."""
    _skip(
        {"bucket_cap_mb": 0.002, "gradient_as_bucket_view": True},
        use=lambda step: step % 3 == 0,
        zero_grad=lambda step: None if step % 2 else False,
        steps=6,
    )


def skip_unused_static_graph() -> None:
    """``static_graph``: the first iteration reduces everything; then unused buckets skip."""
    _skip({"bucket_cap_mb": 0.002, "static_graph": True, "find_unused_parameters": False})


def skip_without_find_unused() -> None:
    """Without ``find_unused_parameters`` nothing counts as unused: every bucket is reduced."""
    _skip({"bucket_cap_mb": 0.002, "find_unused_parameters": False}, use=lambda step: True)


# ---- sparse gradients --------------------------------------------------------------------


def _bag_batches(step: int, rank: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(7 * step + 31 * rank)
    return (torch.randint(0, 10, (4, 2), generator=g), torch.randint(0, 10, (4,), generator=g))


def _cross_entropy(out: torch.Tensor, batch: tuple[Any, ...]) -> torch.Tensor:
    return F.cross_entropy(out, batch[-1])


def _mixed_batches(step: int, rank: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(11 * step + 17 * rank)
    return (torch.randint(0, 30, (5, 3), generator=g), torch.randint(0, 10, (5,), generator=g))


def sparse_grad_is_view() -> None:
    """torch's test_sparse_gradients_grad_is_view: ``gradient_as_bucket_view`` with the
    sparse EmbeddingBag, over several optimizer steps."""
    compare(SparseBag, _bag_batches, _cross_entropy, {"gradient_as_bucket_view": True})


def sparse_grad_is_view_hook() -> None:
    """The same through torch's sparse gloo hook; the hook sees the same bucket on both."""
    compare(
        SparseBag,
        _bag_batches,
        _cross_entropy,
        {"gradient_as_bucket_view": True},
        hook="sparse_gloo",
        bucket_log={},
    )


def sparse_accumulating_view() -> None:
    """Gradients never cleared: the sparse ``.grad`` keeps growing, the dense ones are views."""
    compare(
        SparseAndDense,
        _mixed_batches,
        _cross_entropy,
        {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
        zero_grad=lambda step: None,
    )


def sparse_and_dense_view_hook() -> None:
    """Sparse and dense buckets under one hook with bucket views, gradients zeroed in place."""
    compare(
        SparseAndDense,
        _mixed_batches,
        _cross_entropy,
        {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
        hook="sparse_gloo",
        zero_grad=lambda step: False,
        bucket_log={},
    )


SCENARIOS: dict[str, Callable[[], None]] = {
    "skip_unused": skip_unused,
    "skip_unused_one_bucket": skip_unused_one_bucket,
    "skip_unused_hook": skip_unused_hook,
    "skip_unused_alternating": skip_unused_alternating,
    "skip_unused_bucket_view": skip_unused_bucket_view,
    "skip_unused_static_graph": skip_unused_static_graph,
    "skip_without_find_unused": skip_without_find_unused,
    "sparse_grad_is_view": sparse_grad_is_view,
    "sparse_grad_is_view_hook": sparse_grad_is_view_hook,
    "sparse_accumulating_view": sparse_accumulating_view,
    "sparse_and_dense_view_hook": sparse_and_dense_view_hook,
}


def main(rank: int, world: int, port: int) -> None:
    """Run the scenarios named on the command line (all by default) in a gloo world."""
    chosen = sys.argv[4].split(",") if len(sys.argv) > 4 else list(SCENARIOS)
    run_scenarios(rank, world, port, {n: SCENARIOS[n] for n in chosen})
