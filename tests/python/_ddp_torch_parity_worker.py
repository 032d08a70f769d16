"""One rank of the world started by test_ddp_torch_parity.py: ferrodist's DDP step by step
against torch's own DDP, for ``skip_all_reduce_unused_params`` and sparse gradients.

Each scenario builds one model from one seed, wraps it in torch's DDP and, again, in
ferrodist's with the same options, trains each on the same rank-dependent batches and records
after every backward each parameter's gradient; the check is that each is bitwise torch's (same
layout; a sparse gradient down to its uncoalesced indices and values; ``None`` where torch's is
``None``), that the parameters after the optimizer step are bitwise equal too, and that the
Logger's ``num_buckets_reduced`` agrees. Every scenario prints ``RESULT name PASS`` or ``RESULT
name FAIL why``. The sparse scenarios train torch's side in a world of its own that never loads
ferrodist (see ``SPARSE``); this module imports ferrodist only when ferrodist's side trains.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as torch_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

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


def _sparse_ferrodist_hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """The same hook written against ferrodist's API (``ferrodist.all_reduce``), which sums a
    sparse buffer with ferrodist's own reduction (``ferrodist._sparse_all_reduce``)."""
    import ferrodist

    world = dist.get_world_size()
    work = ferrodist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda f: f.wait()[0] / world)


def _sides(kind: str) -> tuple[Any, Any, Any]:
    """``(DDP class, default hooks, sparse hook)`` of one side; ferrodist's imported only when
    its side runs (torch's side of the sparse scenarios runs in a world without it)."""
    if kind == "torch":
        return TorchDDP, torch_hooks, _sparse_gloo_hook
    from ferrodist.algorithms.ddp_comm_hooks import default_hooks
    from ferrodist.nn import DistributedDataParallel

    return DistributedDataParallel, default_hooks, _sparse_ferrodist_hook


def train(
    kind: str,
    make: Callable[[], nn.Module],
    batches: Callable[[int, int], tuple[Any, ...]],
    loss_of: Callable[[torch.Tensor, tuple[Any, ...]], torch.Tensor],
    ddp: dict[str, Any],
    hook: Optional[str] = None,
    zero_grad: Callable[[int], Optional[bool]] = lambda step: True,
    steps: int = STEPS,
    log_buckets: bool = False,
) -> tuple[dict[str, Any], Any]:
    """Train one side's DDP (``kind``: torch or ferrodist); ``(trace, the DDP)``.

    ``batches(step, rank)`` gives the forward's arguments (and the target), ``loss_of(out, b)``
    the loss; ``zero_grad(step)`` says how the gradients are cleared after the step: ``True``
    set to None, ``False`` zeroed in place, ``None`` left to accumulate. The trace holds, per
    step, each parameter's gradient after backward, the Logger's ``num_buckets_reduced`` and
    the parameters after the optimizer step; with ``log_buckets``, what the hook was handed
    and whether each sparse ``.grad`` is still the tensor the hook had after backward.
    """
    rank = dist.get_rank()
    torch.manual_seed(3 + rank)  # different inits per rank: DDP's broadcast must fix them
    net = make()
    cls, hooks, sparse_hook = _sides(kind)
    wrapped = cls(net, **ddp)
    seen: list[Any] = []
    handed: list[Any] = []
    if hook == "allreduce":
        wrapped.register_comm_hook(None, hooks.allreduce_hook)
    elif hook == "sparse_gloo":

        def logged(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks annotations
            params = bucket.parameters()
            handed.append((bucket.buffer(), params))
            seen.append(
                (
                    bucket.index(),
                    [str(g.layout) for g in bucket.gradients()],
                    len(params),
                    # the buffer of a sparse bucket is the gradient itself
                    [bucket.buffer() is p.grad for p in params],
                )
            )
            return sparse_hook(state, bucket)

        wrapped.register_comm_hook(None, logged)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    trace: dict[str, Any] = {"steps": [], "seen": seen, "after": []}
    for step in range(steps):
        batch = batches(step, rank)
        loss_of(wrapped(*batch[:-1]), batch).backward()
        if log_buckets:  # is each sparse .grad still the tensor the hook had?
            trace["after"].append(
                [b is p.grad for b, params in handed if b.is_sparse for p in params]
            )
            handed.clear()
        grads = [
            (name, None if p.grad is None else p.grad.clone()) for name, p in net.named_parameters()
        ]
        reduced = wrapped._get_ddp_logging_data().get("num_buckets_reduced")
        clear = zero_grad(step)
        opt.step()
        if clear is not None:
            opt.zero_grad(set_to_none=clear)
        params = [(name, p.detach().clone()) for name, p in net.named_parameters()]
        trace["steps"].append({"grads": grads, "reduced": reduced, "params": params})
    if not log_buckets:
        trace["seen"] = trace["after"] = None
    return trace, wrapped


def check(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Assert that ferrodist's trace (``ours``) is torch's, bit for bit, step by step."""
    for step, (mine, torchs) in enumerate(zip(ours["steps"], theirs["steps"], strict=True)):
        for (name, fg), (_, tg) in zip(mine["grads"], torchs["grads"], strict=True):
            _same_grad(f"step {step} {name}", fg, tg)
        # torch logs it since it has skip_all_reduce_unused_params (not 2.4); ours always does.
        reduced = torchs["reduced"] if torchs["reduced"] is not None else mine["reduced"]
        assert mine["reduced"] == reduced, (
            f"step {step}: num_buckets_reduced {mine['reduced']} vs torch's {torchs['reduced']}"
        )
        for (name, fp), (_, tp) in zip(mine["params"], torchs["params"], strict=True):
            assert torch.equal(fp, tp), f"step {step} {name}: parameters differ"
    for key in ("seen", "after"):
        assert ours[key] == theirs[key], f"hook's view ({key}): {ours[key]} vs {theirs[key]}"


def compare(*args: Any, **kwargs: Any) -> Any:
    """Train torch's DDP, then ferrodist's, in this world (``train``'s arguments after
    ``kind``); assert that ferrodist's trace is torch's. Returns ferrodist's DDP."""
    theirs, _ = train("torch", *args, **kwargs)
    ours, ddp = train("ferrodist", *args, **kwargs)
    check(ours, theirs)
    return ddp


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


#: The sparse scenarios, as ``train``'s arguments after ``kind``: torch's side trains in a world
#: that never loads ferrodist (``torch_sparse_traces``, run by ``_torch_only_world``), since
#: torch's gloo sparse all-reduce corrupts the heap now and then beside a Rust extension (README,
#: DDP table); ferrodist's side trains in the scenario world and checks against it.
SPARSE: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    # torch's test_sparse_gradients_grad_is_view: ``gradient_as_bucket_view`` with the sparse
    # EmbeddingBag, over several optimizer steps
    "sparse_grad_is_view": (
        (SparseBag, _bag_batches, _cross_entropy, {"gradient_as_bucket_view": True}),
        {},
    ),
    # the same through torch's sparse gloo hook (ours: the same hook over ferrodist.all_reduce);
    # the hook sees the same bucket on both
    "sparse_grad_is_view_hook": (
        (SparseBag, _bag_batches, _cross_entropy, {"gradient_as_bucket_view": True}),
        {"hook": "sparse_gloo", "log_buckets": True},
    ),
    # gradients never cleared: the sparse ``.grad`` keeps growing, the dense ones are views
    "sparse_accumulating_view": (
        (
            SparseAndDense,
            _mixed_batches,
            _cross_entropy,
            {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
        ),
        {"zero_grad": lambda step: None},
    ),
    # sparse and dense buckets under one hook with bucket views, gradients zeroed in place
    "sparse_and_dense_view_hook": (
        (
            SparseAndDense,
            _mixed_batches,
            _cross_entropy,
            {"gradient_as_bucket_view": True, "bucket_cap_mb": 0.001},
        ),
        {"hook": "sparse_gloo", "zero_grad": lambda step: False, "log_buckets": True},
    ),
}

TORCH_TRACES_ENV = "FERRODIST_TEST_TORCH_SPARSE_TRACES"
"""Names the file that holds torch's sparse traces, ``{rank: torch_sparse_traces()}``."""


def torch_sparse_traces() -> bytes:
    """torch's side of every sparse scenario, pickled (run in a world without ferrodist)."""
    return pickle.dumps({name: train("torch", *a, **kw)[0] for name, (a, kw) in SPARSE.items()})


def _sparse_scenario(name: str) -> Callable[[], None]:
    def scenario() -> None:
        with open(os.environ[TORCH_TRACES_ENV], "rb") as f:
            theirs = pickle.loads(pickle.load(f)[dist.get_rank()])[name]
        args, kwargs = SPARSE[name]
        check(train("ferrodist", *args, **kwargs)[0], theirs)

    return scenario


SCENARIOS: dict[str, Callable[[], None]] = {
    "skip_unused": skip_unused,
    "skip_unused_one_bucket": skip_unused_one_bucket,
    "skip_unused_hook": skip_unused_hook,
    "skip_unused_alternating": skip_unused_alternating,
    "skip_unused_bucket_view": skip_unused_bucket_view,
    "skip_unused_static_graph": skip_unused_static_graph,
    "skip_without_find_unused": skip_without_find_unused,
    **{name: _sparse_scenario(name) for name in SPARSE},
}


def main(rank: int, world: int, port: int) -> None:
    """Run the scenarios named on the command line (all by default) in a gloo world."""
    from _scenario_world import run_scenarios  # imports ferrodist: not at this module's import

    chosen = sys.argv[4].split(",") if len(sys.argv) > 4 else list(SCENARIOS)
    run_scenarios(rank, world, port, {n: SCENARIOS[n] for n in chosen})
